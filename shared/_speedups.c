/* Two per-frame loops of the transceiver's media path, in C (shared/speedups.py says why).
 *
 * mask(data, key) -> bytes: `data` XORed with the 4-byte `key` repeated (RFC 6455 §5.3); the
 *     same call unmasks.
 * peak(pcm) -> int: the largest |sample| of PCM16 little-endian (an odd last byte is ignored).
 *
 * Both take any contiguous buffer and never keep it; a wrong argument raises TypeError or
 * ValueError, as the numpy versions they stand for do.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *speedups_mask(PyObject *self, PyObject *args) {
    Py_buffer data, key;
    if (!PyArg_ParseTuple(args, "y*y*", &data, &key))
        return NULL;
    PyObject *out = NULL;
    if (key.len != 4) {
        PyErr_SetString(PyExc_ValueError, "a WebSocket mask key is 4 bytes");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, data.len);
    if (out == NULL)
        goto done;
    const unsigned char *in = data.buf;
    const unsigned char *k = key.buf;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t n = data.len, i = 0;
    uint32_t k32;
    memcpy(&k32, k, 4); /* the key's bytes in memory order: word i covers bytes 4i..4i+3 */
    uint64_t k64 = ((uint64_t)k32 << 32) | k32;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, in + i, 8);
        w ^= k64;
        memcpy(o + i, &w, 8);
    }
    for (; i < n; i++)
        o[i] = in[i] ^ k[i & 3];
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&key);
    return out;
}

static PyObject *speedups_peak(PyObject *self, PyObject *args) {
    Py_buffer pcm;
    if (!PyArg_ParseTuple(args, "y*", &pcm))
        return NULL;
    const unsigned char *p = pcm.buf;
    Py_ssize_t samples = pcm.len / 2;
    long top = 0;
    for (Py_ssize_t i = 0; i < samples; i++) {
        long s = (int16_t)(uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
        long a = s < 0 ? -s : s;
        if (a > top)
            top = a;
    }
    PyBuffer_Release(&pcm);
    return PyLong_FromLong(top);
}

static PyMethodDef methods[] = {
    {"mask", speedups_mask, METH_VARARGS, "XOR data with a 4-byte key repeated (RFC 6455)."},
    {"peak", speedups_peak, METH_VARARGS, "The largest |sample| of PCM16 little-endian."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_speedups",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
