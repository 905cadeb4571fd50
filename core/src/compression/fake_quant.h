#pragma once
// Quantization-aware training (private: LibTorch types). QatLinear and QatConv2d are the zoo's
// Linear and Conv2d (they derive from them, so export, checkpoints and the int8 conversion see
// ordinary layers with the same parameter names) whose forward runs on what the int8 model will
// compute with:
//
//   weights   symmetric int8 per output channel, scale max|w| / 127 (packLinear's rounding)
//   inputs    symmetric int8 per tensor, scale act_absmax / 127, where act_absmax (a buffer, so
//             it is checkpointed and resumed) is the moving average (0.01, as torch.ao's
//             MovingAverageMinMaxObserver) of the batches' max |x|, started at the first batch
//
// Rounding uses ATen's fake_quantize ops, whose backward is the clipped straight-through
// estimator: the gradient passes unchanged inside the int8 range and is zero where the input
// was clamped. After training, act_absmax / 127 of each layer becomes the static input scale of
// lathe::linear_int8 / conv2d_int8 (compression::quantizeWithScales).
#include <torch/torch.h>

namespace lathe::core::compression {

inline constexpr double kQatMomentum = 0.01;

/// x rounded to int8 steps of `absmax` / 127 (symmetric, clipped STE in backward); in training
/// mode `absmax` first takes the batch's max |x| into its moving average.
torch::Tensor fakeQuantInput(const torch::Tensor& x, torch::Tensor& absmax, bool training);
/// w rounded per output channel (dim 0) to int8 steps of max|w_c| / 127.
torch::Tensor fakeQuantWeight(const torch::Tensor& w);

struct QatLinearImpl : torch::nn::LinearImpl {
    explicit QatLinearImpl(const torch::nn::LinearOptions& options);
    torch::Tensor forward(const torch::Tensor& x);
    torch::Tensor actAbsmax;
};

struct QatConv2dImpl : torch::nn::Conv2dImpl {
    explicit QatConv2dImpl(const torch::nn::Conv2dOptions& options);
    torch::Tensor forward(const torch::Tensor& x);
    torch::Tensor actAbsmax;
};

/// The input scales (act_absmax / 127) of the model's quantization-aware layers, in order.
/// Empty when it has none.
std::vector<float> qatInputScales(torch::nn::Sequential& model);

}  // namespace lathe::core::compression
