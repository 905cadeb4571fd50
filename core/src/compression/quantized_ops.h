#pragma once
// Lathe's quantized TorchScript operators (private: LibTorch types). Registered with the
// dispatcher when liblathe_torch is loaded (TORCH_LIBRARY(lathe, ...) in quantized_ops.cpp), so a
// compressed artifact that calls them loads in any process that loaded the library:
//
//   lathe::linear_int8(Tensor x, Tensor packed, Tensor col_sums, Tensor scales, Tensor? bias,
//                      int out_features, int in_features, bool relu=False) -> Tensor
//
// x: float [..., in_features]; packed: int8 [packedWeightBytes(out, in)] (kernels/qgemm.h's
// layout); col_sums: int32 [qPaddedN(out)]; scales: float [out]; bias: float [out] or None.
// Every tensor is checked against the sizes before a byte is read: the file is untrusted.
#include <torch/types.h>

#include <cstdint>

namespace lathe::core::compression {

inline constexpr const char* kLinearInt8 = "lathe::linear_int8";

/// Int8 weights of a fp32 [out, in] matrix, packed for the op: per-channel scales, col sums.
struct PackedLinear {
    at::Tensor packed, colSums, scales;
};
PackedLinear packLinear(const at::Tensor& weight);

at::Tensor linearInt8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& colSums,
                      const at::Tensor& scales, const c10::optional<at::Tensor>& bias, int64_t outFeatures,
                      int64_t inFeatures, bool relu);

/// Makes sure the registration above ran (a no-op call that keeps the object file linked).
void ensureQuantizedOpsRegistered();

}  // namespace lathe::core::compression
