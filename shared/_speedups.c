/* Per-frame work of the transceiver's media path, in C (shared/speedups.py says why).
 *
 * mask(data, key) -> bytes: `data` XORed with the 4-byte `key` repeated (RFC 6455 §5.3); the
 *     same call unmasks.
 * peak(pcm) -> int: the largest |sample| of PCM16 little-endian (an odd last byte is ignored).
 *
 * Both take any contiguous buffer and never keep it; a wrong argument raises TypeError or
 * ValueError, as the numpy versions they stand for do. So do the Opus calls below.
 *
 * libopus's two per-frame calls, made from here instead of through ctypes (media/opus.py):
 * opus_bind(encode_address, decode_address): the addresses of opus_encode and opus_decode in
 *     the libopus opus.py loaded (it passes them once, when it loads the library);
 * opus_encode(state, pcm, max_bytes) -> bytes: one packet of the PCM16 mono frame;
 * opus_decode(state, payload or None, frame_size, fec) -> bytes: PCM16 mono (None: conceal).
 * `state` must be the address of an encoder or decoder (mono, 48 kHz) opus.py made and has
 * not destroyed: nothing here or in libopus can check it, as nothing could through ctypes. A
 * negative libopus result raises ValueError(code), and so do arguments out of range
 * (ValueError(-1), OPUS_BAD_ARG, as libopus would say).
 *
 * libsrtp's four per-packet calls, made from here instead of through pylibsrtp's wrapper
 * (media/srtp.py):
 * srtp_bind(protect, unprotect, protect_rtcp, unprotect_rtcp): their addresses in the libsrtp
 *     pylibsrtp loaded (srtp.py passes them once, when it is imported);
 * srtp_apply(op, session, packet) -> bytes or int: `op` indexes the four as bound; the packet
 *     protected or unprotected, or, when libsrtp refuses it, its status (an int: 7 failed
 *     authentication, 9 and 10 a replay); a packet too long to process in 1,500 bytes with
 *     its trailer is status 2 (bad_param), the same bound as pylibsrtp's. A refusal is a
 *     value, not an exception: forged packets are what an attacker sends most cheaply.
 * `session` must be the address of a libsrtp session (srtp_t) that is alive.
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

/* opus.h's two calls (the types of opus_int16, opus_int32: int16_t, int32_t) */
typedef int32_t (*opus_encode_fn)(void *, const int16_t *, int, unsigned char *, int32_t);
typedef int (*opus_decode_fn)(void *, const unsigned char *, int32_t, int16_t *, int, int);
static opus_encode_fn opus_encode_p = NULL;
static opus_decode_fn opus_decode_p = NULL;
#define OPUS_MAX_PACKET 1500 /* media/opus.py MAX_PACKET */
#define OPUS_MAX_SAMPLES 5760 /* 120 ms at 48 kHz, the longest Opus packet */

static PyObject *speedups_opus_bind(PyObject *self, PyObject *args) {
    PyObject *encode, *decode;
    if (!PyArg_ParseTuple(args, "OO", &encode, &decode))
        return NULL;
    void *e = PyLong_AsVoidPtr(encode);
    if (e == NULL && PyErr_Occurred())
        return NULL;
    void *d = PyLong_AsVoidPtr(decode);
    if (d == NULL && PyErr_Occurred())
        return NULL;
    if (e == NULL || d == NULL) {
        PyErr_SetString(PyExc_ValueError, "a libopus function's address is needed");
        return NULL;
    }
    opus_encode_p = (opus_encode_fn)e;
    opus_decode_p = (opus_decode_fn)d;
    Py_RETURN_NONE;
}

static void *opus_state(PyObject *address, void *bound) {
    if (bound == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libopus is not bound (opus_bind)");
        return NULL;
    }
    void *state = PyLong_AsVoidPtr(address);
    if (state == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "no libopus state (closed?)");
    return state;
}

static PyObject *opus_failed(long code) {
    PyObject *value = PyLong_FromLong(code);
    if (value != NULL) {
        PyErr_SetObject(PyExc_ValueError, value);
        Py_DECREF(value);
    }
    return NULL;
}

static PyObject *speedups_opus_encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "opus_encode(state, pcm, max_bytes)");
        return NULL;
    }
    void *state = opus_state(args[0], (void *)opus_encode_p);
    if (state == NULL)
        return NULL;
    long max_bytes = PyLong_AsLong(args[2]);
    if (max_bytes == -1 && PyErr_Occurred())
        return NULL;
    if (max_bytes < 1 || max_bytes > OPUS_MAX_PACKET)
        return opus_failed(-1);
    Py_buffer pcm;
    if (PyObject_GetBuffer(args[1], &pcm, PyBUF_SIMPLE) < 0)
        return NULL;
    unsigned char out[OPUS_MAX_PACKET];
    int32_t n = -1; /* OPUS_BAD_ARG */
    if (pcm.len / 2 <= OPUS_MAX_SAMPLES) /* (longer is no frame libopus takes) */
        n = opus_encode_p(state, (const int16_t *)pcm.buf, (int)(pcm.len / 2), out,
                          (int32_t)max_bytes);
    PyBuffer_Release(&pcm);
    if (n < 0)
        return opus_failed(n);
    return PyBytes_FromStringAndSize((const char *)out, n);
}

static PyObject *speedups_opus_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "opus_decode(state, payload, frame_size, fec)");
        return NULL;
    }
    void *state = opus_state(args[0], (void *)opus_decode_p);
    if (state == NULL)
        return NULL;
    long frame_size = PyLong_AsLong(args[2]);
    if (frame_size == -1 && PyErr_Occurred())
        return NULL;
    long fec = PyLong_AsLong(args[3]);
    if (fec == -1 && PyErr_Occurred())
        return NULL;
    if (frame_size < 1 || frame_size > OPUS_MAX_SAMPLES)
        return opus_failed(-1);
    Py_buffer payload = {0};
    int has_payload = args[1] != Py_None;
    if (has_payload && PyObject_GetBuffer(args[1], &payload, PyBUF_SIMPLE) < 0)
        return NULL;
    int16_t pcm[OPUS_MAX_SAMPLES];
    int n = -1; /* OPUS_BAD_ARG */
    if (payload.len <= INT32_MAX)
        n = opus_decode_p(state, has_payload ? (const unsigned char *)payload.buf : NULL,
                          (int32_t)payload.len, pcm, (int)frame_size, fec ? 1 : 0);
    if (has_payload)
        PyBuffer_Release(&payload);
    if (n < 0)
        return opus_failed(n);
    return PyBytes_FromStringAndSize((const char *)pcm, (Py_ssize_t)n * 2);
}

/* srtp.h: srtp_err_status_t srtp_protect(srtp_t, void *, int *) and its three siblings */
typedef int (*srtp_fn)(void *, void *, int *);
static srtp_fn srtp_p[4] = {NULL, NULL, NULL, NULL};
#define SRTP_BUFFER 1500 /* pylibsrtp's own buffer: the longest packet either way */
#define SRTP_TRAILER 144 /* SRTP_MAX_TAG_LEN + SRTP_MAX_MKI_LEN */
#define SRTCP_TRAILER 148 /* + SRTCP's index */
#define SRTP_BAD_PARAM 2
static const int srtp_room[4] = {SRTP_TRAILER, 0, SRTCP_TRAILER, 0};

static PyObject *speedups_srtp_bind(PyObject *self, PyObject *args) {
    PyObject *addresses[4];
    if (!PyArg_ParseTuple(args, "OOOO", &addresses[0], &addresses[1], &addresses[2],
                          &addresses[3]))
        return NULL;
    srtp_fn bound[4];
    for (int i = 0; i < 4; i++) {
        void *f = PyLong_AsVoidPtr(addresses[i]);
        if (f == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a libsrtp function's address is needed");
            return NULL;
        }
        bound[i] = (srtp_fn)f;
    }
    memcpy(srtp_p, bound, sizeof(bound));
    Py_RETURN_NONE;
}

static PyObject *speedups_srtp_apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "srtp_apply(op, session, packet)");
        return NULL;
    }
    long op = PyLong_AsLong(args[0]);
    if (op == -1 && PyErr_Occurred())
        return NULL;
    if (op < 0 || op > 3) {
        PyErr_SetString(PyExc_ValueError, "op is 0-3 (protect, unprotect, their RTCP)");
        return NULL;
    }
    if (srtp_p[op] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libsrtp is not bound (srtp_bind)");
        return NULL;
    }
    void *session = PyLong_AsVoidPtr(args[1]);
    if (session == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "no libsrtp session");
        return NULL;
    }
    Py_buffer packet;
    if (PyObject_GetBuffer(args[2], &packet, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t buffer[SRTP_BUFFER / 4]; /* (libsrtp reads the header as 32-bit words) */
    int status = SRTP_BAD_PARAM, n = (int)packet.len;
    if (packet.len <= SRTP_BUFFER - srtp_room[op]) {
        memcpy(buffer, packet.buf, packet.len);
        status = srtp_p[op](session, buffer, &n);
    }
    PyBuffer_Release(&packet);
    if (status != 0)
        return PyLong_FromLong(status);
    return PyBytes_FromStringAndSize((const char *)buffer, n);
}

static PyMethodDef methods[] = {
    {"mask", speedups_mask, METH_VARARGS, "XOR data with a 4-byte key repeated (RFC 6455)."},
    {"peak", speedups_peak, METH_VARARGS, "The largest |sample| of PCM16 little-endian."},
    {"opus_bind", speedups_opus_bind, METH_VARARGS, "Bind libopus's encode and decode."},
    {"opus_encode", (PyCFunction)(void (*)(void))speedups_opus_encode, METH_FASTCALL,
     "One Opus packet of a PCM16 mono frame."},
    {"opus_decode", (PyCFunction)(void (*)(void))speedups_opus_decode, METH_FASTCALL,
     "PCM16 mono of one Opus packet (None: concealment)."},
    {"srtp_bind", speedups_srtp_bind, METH_VARARGS, "Bind libsrtp's four per-packet calls."},
    {"srtp_apply", (PyCFunction)(void (*)(void))speedups_srtp_apply, METH_FASTCALL,
     "One packet through libsrtp: the result, or libsrtp's status (int) when refused."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_speedups",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
