/* firsthop: what upstream's generated rnnoise_data.c does at init, for the shapes in
   rnnoise_data.h (the calls its weight-exchange writer emits, names and all). Where the blob
   holds a layer's int8 weights and not its float ones, the layer runs on the int8 path. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "rnnoise_data.h"

#define GRU_INIT(name, inputs) \
  (linear_init(&model->name##_input, arrays, #name "_input_bias", #name "_input_subias", \
               #name "_input_weights_int8", #name "_input_weights_float", \
               #name "_input_weights_idx", NULL, #name "_input_scale", (inputs), 3 * name##_ex) || \
   linear_init(&model->name##_recurrent, arrays, #name "_recurrent_bias", #name "_recurrent_subias", \
               #name "_recurrent_weights_int8", #name "_recurrent_weights_float", \
               #name "_recurrent_weights_idx", #name "_recurrent_weights_diag", \
               #name "_recurrent_scale", name##_ex, 3 * name##_ex))

/* firsthop: an int8 layer stored "sparse" whose index lists every 4-column block of every 8-row
   block, in order, holds its weights in exactly the dense kernel's layout (cgemv8x4: row block
   by row block, 4 columns at a time). It runs the dense kernel, which sums the same products in
   the same order without reading the index: the same output, about a quarter less CPU for the
   GRUs. pyrnnoise's model stores all six GRU matrices so. A truly sparse index is left as it is. */
static void dense_when_full(LinearLayer *layer) {
  const int *idx = layer->weights_idx;
  int i, j;
  if (idx == NULL || layer->weights == NULL || layer->float_weights != NULL) return;
  if (layer->nb_inputs % 4 != 0 || layer->nb_outputs % 8 != 0) return;
  for (i = 0; i < layer->nb_outputs; i += 8) {
    if (*idx++ != layer->nb_inputs / 4) return;
    for (j = 0; j < layer->nb_inputs; j += 4) {
      if (*idx++ != j) return;
    }
  }
  layer->weights_idx = NULL;
}

#define DENSE_WHEN_FULL(name) \
  (dense_when_full(&model->name##_input), dense_when_full(&model->name##_recurrent))

#define gru1_ex GRU1_OUT_SIZE
#define gru2_ex GRU2_OUT_SIZE
#define gru3_ex GRU3_OUT_SIZE

int init_rnnoise(RNNoise *model, const WeightArray *arrays) {
  if (linear_init(&model->conv1, arrays, "conv1_bias", NULL, NULL, "conv1_weights_float", NULL,
                  NULL, NULL, 3 * CONV1_IN_SIZE, CONV1_OUT_SIZE)) return 1;
  if (linear_init(&model->conv2, arrays, "conv2_bias", "conv2_subias", "conv2_weights_int8",
                  "conv2_weights_float", NULL, NULL, "conv2_scale", 3 * CONV2_IN_SIZE,
                  CONV2_OUT_SIZE)) return 1;
  if (GRU_INIT(gru1, CONV2_OUT_SIZE)) return 1;
  if (GRU_INIT(gru2, GRU1_OUT_SIZE)) return 1;
  if (GRU_INIT(gru3, GRU2_OUT_SIZE)) return 1;
  if (linear_init(&model->dense_out, arrays, "dense_out_bias", NULL, NULL,
                  "dense_out_weights_float", NULL, NULL, NULL,
                  CONV2_OUT_SIZE + GRU1_OUT_SIZE + GRU2_OUT_SIZE + GRU3_OUT_SIZE,
                  DENSE_OUT_OUT_SIZE)) return 1;
  if (linear_init(&model->vad_dense, arrays, "vad_dense_bias", NULL, NULL,
                  "vad_dense_weights_float", NULL, NULL, NULL,
                  CONV2_OUT_SIZE + GRU1_OUT_SIZE + GRU2_OUT_SIZE + GRU3_OUT_SIZE,
                  VAD_DENSE_OUT_SIZE)) return 1;
  DENSE_WHEN_FULL(gru1);
  DENSE_WHEN_FULL(gru2);
  DENSE_WHEN_FULL(gru3);
  return 0;
}
