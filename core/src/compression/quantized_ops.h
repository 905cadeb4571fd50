#pragma once
// Lathe's quantized TorchScript operators (private: LibTorch types). Registered with the
// dispatcher when liblathe_torch is loaded (TORCH_LIBRARY(lathe, ...) in quantized_ops.cpp), so a
// compressed artifact that calls them loads in any process that loaded the library:
//
//   lathe::linear_int8(Tensor x, Tensor packed, Tensor col_sums, Tensor scales, Tensor? bias,
//                      int out_features, int in_features, bool relu=False, float input_scale=0.0,
//                      float output_scale=0.0)
//   lathe::conv2d_int8(Tensor x, ... int out_channels, int in_channels, int[2] kernel,
//                      int[2] stride, int[2] padding, int[2] dilation, bool relu=False,
//                      float input_scale=0.0, float output_scale=0.0)   (groups 1; im2col + the GEMM)
//   lathe::observe(Tensor x, int id) -> x                          (calibration only)
//
// x: float [..., in_features] (conv: [N, C, H, W]); packed: int8 [packedWeightBytes(out, K)]
// (kernels/qgemm.h's layout, K = in_features or C * kh * kw); col_sums: int32 [qPaddedN(out)];
// scales: float [out]; bias: float [out] or None. input_scale 0: each input row gets its own
// scale at run time (dynamic); > 0: the calibrated scale of static quantization. relu: fused into
// the epilogue. x may also be int8 codes (Char) of scale input_scale, as the previous layer made
// them. output_scale > 0: the result is returned as int8 codes of that scale (the next layer's
// input scale, the same rounding the next layer would apply), so the tensor between two quantized
// layers is int8; 0: fp32. Every tensor is checked against the sizes before a byte is read: the file is
// untrusted.
#include <torch/types.h>

#include <cstdint>
#include <functional>

namespace lathe::core::compression {

inline constexpr const char* kLinearInt8 = "lathe::linear_int8";

/// Int8 weights of a fp32 [out, in] matrix (a conv's [out, C, kh, kw] is taken as [out, C*kh*kw]),
/// packed for the ops: per-channel scales, col sums.
struct PackedLinear {
    at::Tensor packed, colSums, scales;
};
PackedLinear packLinear(const at::Tensor& weight);

inline constexpr const char* kConv2dInt8 = "lathe::conv2d_int8";
inline constexpr const char* kObserve = "lathe::observe";

at::Tensor linearInt8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& colSums,
                      const at::Tensor& scales, const c10::optional<at::Tensor>& bias, int64_t outFeatures,
                      int64_t inFeatures, bool relu, double inputScale, double outputScale);
at::Tensor conv2dInt8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& colSums,
                      const at::Tensor& scales, const c10::optional<at::Tensor>& bias, int64_t outChannels,
                      int64_t inChannels, at::IntArrayRef kernel, at::IntArrayRef stride,
                      at::IntArrayRef padding, at::IntArrayRef dilation, bool relu, double inputScale,
                      double outputScale);

/// While one is alive on this thread, lathe::observe(x, id) calls fn(id, x) (calibration).
using ObserveFn = std::function<void(int64_t id, const at::Tensor& x)>;
class ObserveScope {
public:
    explicit ObserveScope(ObserveFn fn);
    ~ObserveScope();
    ObserveScope(const ObserveScope&) = delete;
    ObserveScope& operator=(const ObserveScope&) = delete;

private:
    ObserveFn m_fn;
    ObserveFn* m_previous;
};
at::Tensor observe(const at::Tensor& x, int64_t id);

/// Makes sure the registration above ran (a no-op call that keeps the object file linked).
void ensureQuantizedOpsRegistered();

}  // namespace lathe::core::compression
