/* firsthop's entry points into RNNoise, built as the extension module
   firsthop.services.transceiver.media._rnnoise and called through ctypes (denoise.py).

   Everything of RNNoise is compiled with hidden visibility, so these functions are all the
   module exports: pyrnnoise's own librnnoise.so, loaded in the same process for its weights,
   exports the same rnnoise_* names, and neither library may bind to the other's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#include "rnnoise.h"
#include "cpu_support.h"

#define BLOCK 480 /* samples: 10 ms at 48 kHz */
#define EXPORT __attribute__((visibility("default")))

/* The model's weight arrays in upstream's blob format; `blob` must outlive the model. */
EXPORT RNNModel *firsthop_rnnoise_model(const void *blob, int len) {
  if (blob == NULL || len <= 0) return NULL;
  return rnnoise_model_from_buffer(blob, len);
}

EXPORT void firsthop_rnnoise_model_free(RNNModel *model) {
  if (model != NULL) rnnoise_model_free(model);
}

/* NULL when the blob is not a model of the shapes in src/rnnoise_data.h. */
EXPORT DenoiseState *firsthop_rnnoise_create(RNNModel *model) {
  if (model == NULL) return NULL;
  return rnnoise_create(model);
}

EXPORT void firsthop_rnnoise_destroy(DenoiseState *st) {
  if (st != NULL) rnnoise_destroy(st);
}

/* The kernels run-time dispatch picked: 0 generic (SSE2 on x86-64), 1 SSE4.1, 2 AVX2. */
EXPORT int firsthop_rnnoise_arch(void) { return rnn_select_arch(); }

/* `blocks` whole 10 ms blocks of PCM16 in, as many out (`out` may be `in`); returns the voice
   probability of the last block. */
EXPORT float firsthop_rnnoise_pcm16(DenoiseState *st, int16_t *out, const int16_t *in, int blocks) {
  float x[BLOCK], y[BLOCK];
  float vad = 0;
  int b, i;
  for (b = 0; b < blocks; b++) {
    for (i = 0; i < BLOCK; i++) x[i] = in[b * BLOCK + i];
    vad = rnnoise_process_frame(st, y, x);
    for (i = 0; i < BLOCK; i++) {
      float v = y[i];
      v = v > 32767.f ? 32767.f : (v < -32768.f ? -32768.f : v);
      out[b * BLOCK + i] = (int16_t)lrintf(v);
    }
  }
  return vad;
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rnnoise",
    "RNNoise built for firsthop (int8 weights, x86 run-time dispatch); called through ctypes.",
    -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rnnoise(void) { return PyModule_Create(&module); }
