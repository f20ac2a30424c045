/* firsthop: the layer sizes and the loader of RNNoise's model as it comes in pyrnnoise 0.4.5
   (RNNoise 0.2's model, commit 0a8755f8 of model_version). Upstream generates this file with its
   weights (download_model.sh); here the weights stay in pyrnnoise's library and reach these layers
   as a blob at run time (USE_WEIGHTS_FILE), so only the shapes are written down. A model of other
   shapes is refused by linear_init (every array's size is checked), never read out of bounds. */
#ifndef RNNOISE_DATA_H
#define RNNOISE_DATA_H
#include "nnet.h"

#define CONV1_OUT_SIZE 128
#define CONV1_IN_SIZE 65
#define CONV1_STATE_SIZE (65 * 2)
#define CONV1_DELAY 1
#define CONV2_OUT_SIZE 384
#define CONV2_IN_SIZE 128
#define CONV2_STATE_SIZE (128 * 2)
#define CONV2_DELAY 1
#define GRU1_OUT_SIZE 384
#define GRU1_STATE_SIZE 384
#define GRU2_OUT_SIZE 384
#define GRU2_STATE_SIZE 384
#define GRU3_OUT_SIZE 384
#define GRU3_STATE_SIZE 384
#define DENSE_OUT_OUT_SIZE 32
#define VAD_DENSE_OUT_SIZE 1

typedef struct {
  LinearLayer conv1;
  LinearLayer conv2;
  LinearLayer gru1_input;
  LinearLayer gru1_recurrent;
  LinearLayer gru2_input;
  LinearLayer gru2_recurrent;
  LinearLayer gru3_input;
  LinearLayer gru3_recurrent;
  LinearLayer dense_out;
  LinearLayer vad_dense;
} RNNoise;

int init_rnnoise(RNNoise *model, const WeightArray *arrays);

#endif
