// lathe::linear_int8 on the kernels' int8 GEMM (quantized_ops.h).
#include "quantized_ops.h"

#include <torch/library.h>

#include <string>

#include "lathe/kernels/qgemm.h"

namespace lathe::core::compression {

PackedLinear packLinear(const at::Tensor& weight) {
    const auto w = weight.detach().to(at::kFloat).contiguous();
    TORCH_CHECK(w.dim() == 2, "linear weight must be 2-D, got ", w.dim(), "-D");
    const auto n = static_cast<size_t>(w.size(0)), k = static_cast<size_t>(w.size(1));
    TORCH_CHECK(k >= 1 && k <= kernels::kQMaxK, "linear layer with ", k, " inputs: the int8 GEMM takes 1..",
                kernels::kQMaxK);
    std::vector<std::int8_t> q(n * k);
    PackedLinear p;
    p.scales = at::empty({static_cast<int64_t>(n)}, at::kFloat);
    kernels::quantizeWeights(w.data_ptr<float>(), n, k, k, q.data(), p.scales.data_ptr<float>());
    p.packed = at::empty({static_cast<int64_t>(kernels::packedWeightBytes(n, k))}, at::kChar);
    p.colSums = at::empty({static_cast<int64_t>(kernels::qPaddedN(n))}, at::kInt);
    kernels::packWeights(q.data(), n, k, k, p.packed.data_ptr<std::int8_t>(),
                         p.colSums.data_ptr<std::int32_t>());
    return p;
}

namespace {

void checkOperand(const at::Tensor& t, at::ScalarType type, int64_t numel, const char* what) {
    TORCH_CHECK(t.defined() && t.scalar_type() == type && t.dim() == 1 && t.numel() == numel &&
                    t.is_contiguous() && t.device().is_cpu(),
                "lathe::linear_int8: ", what, " must be a contiguous 1-D ", c10::toString(type),
                " CPU tensor of ", numel, " values (got ", t.defined() ? t.sizes() : at::IntArrayRef{}, ")");
}

}  // namespace

at::Tensor linearInt8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& colSums,
                      const at::Tensor& scales, const c10::optional<at::Tensor>& bias, int64_t outFeatures,
                      int64_t inFeatures, bool relu) {
    TORCH_CHECK(outFeatures >= 1 && outFeatures <= (int64_t{1} << 24) && inFeatures >= 1 &&
                    inFeatures <= static_cast<int64_t>(kernels::kQMaxK),
                "lathe::linear_int8: bad layer size ", outFeatures, " x ", inFeatures);
    const auto n = static_cast<size_t>(outFeatures), k = static_cast<size_t>(inFeatures);
    checkOperand(packed, at::kChar, static_cast<int64_t>(kernels::packedWeightBytes(n, k)), "packed weights");
    checkOperand(colSums, at::kInt, static_cast<int64_t>(kernels::qPaddedN(n)), "column sums");
    checkOperand(scales, at::kFloat, outFeatures, "scales");
    if (bias && bias->defined()) checkOperand(*bias, at::kFloat, outFeatures, "bias");
    TORCH_CHECK(x.device().is_cpu(), "lathe::linear_int8 runs on the CPU (input on ", x.device(), ")");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) == inFeatures, "lathe::linear_int8: input has ",
                x.dim() ? x.size(-1) : 0, " features, the layer takes ", inFeatures);
    const auto xc = x.to(at::kFloat).contiguous();
    auto outShape = xc.sizes().vec();
    outShape.back() = outFeatures;
    auto y = at::empty(outShape, xc.options());
    const auto rows = static_cast<size_t>(xc.numel() / inFeatures);
    if (rows == 0) return y;
    const kernels::QLinear layer{packed.data_ptr<std::int8_t>(),
                                 colSums.data_ptr<std::int32_t>(),
                                 scales.data_ptr<float>(),
                                 bias && bias->defined() ? bias->data_ptr<float>() : nullptr,
                                 n,
                                 k};
    kernels::qlinear(xc.data_ptr<float>(), rows, k, layer, y.data_ptr<float>(), n, relu);
    return y;
}

void ensureQuantizedOpsRegistered() {}

TORCH_LIBRARY(lathe, m) {
    m.def(
        "linear_int8(Tensor x, Tensor packed, Tensor col_sums, Tensor scales, Tensor? bias, int "
        "out_features, "
        "int in_features, bool relu=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(lathe, CPU, m) { m.impl("linear_int8", &linearInt8); }

}  // namespace lathe::core::compression
