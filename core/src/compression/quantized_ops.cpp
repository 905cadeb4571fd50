// lathe::linear_int8 on the kernels' int8 GEMM (quantized_ops.h).
#include "quantized_ops.h"

#include <torch/library.h>

#include <cmath>
#include <string>

#include "lathe/kernels/qgemm.h"

namespace lathe::core::compression {

PackedLinear packLinear(const at::Tensor& weight) {
    auto w = weight.detach().to(at::kFloat).contiguous();
    if (w.dim() == 4) w = w.reshape({w.size(0), -1});
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

// A static input scale must be a finite positive fp32; 0 means "per row at run time".
float checkedScale(double s) {
    TORCH_CHECK(s == 0 || (std::isfinite(s) && s > 0 && s < 1e30), "lathe: bad input scale ", s);
    return static_cast<float>(s);
}

void checkOperand(const at::Tensor& t, at::ScalarType type, int64_t numel, const char* op, const char* what) {
    TORCH_CHECK(t.defined() && t.scalar_type() == type && t.dim() == 1 && t.numel() == numel &&
                    t.is_contiguous() && t.device().is_cpu(),
                op, ": ", what, " must be a contiguous 1-D ", c10::toString(type), " CPU tensor of ", numel,
                " values (got ", t.defined() ? t.sizes() : at::IntArrayRef{}, ")");
}

// The weights of an n x k layer: every tensor exactly the size the GEMM will read.
void checkWeights(const char* op, const at::Tensor& packed, const at::Tensor& colSums,
                  const at::Tensor& scales, const c10::optional<at::Tensor>& bias, size_t n, size_t k) {
    checkOperand(packed, at::kChar, static_cast<int64_t>(kernels::packedWeightBytes(n, k)), op,
                 "packed weights");
    checkOperand(colSums, at::kInt, static_cast<int64_t>(kernels::qPaddedN(n)), op, "column sums");
    checkOperand(scales, at::kFloat, static_cast<int64_t>(n), op, "scales");
    if (bias && bias->defined()) checkOperand(*bias, at::kFloat, static_cast<int64_t>(n), op, "bias");
}

}  // namespace

at::Tensor linearInt8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& colSums,
                      const at::Tensor& scales, const c10::optional<at::Tensor>& bias, int64_t outFeatures,
                      int64_t inFeatures, bool relu, double inputScale) {
    TORCH_CHECK(outFeatures >= 1 && outFeatures <= (int64_t{1} << 24) && inFeatures >= 1 &&
                    inFeatures <= static_cast<int64_t>(kernels::kQMaxK),
                "lathe::linear_int8: bad layer size ", outFeatures, " x ", inFeatures);
    const auto n = static_cast<size_t>(outFeatures), k = static_cast<size_t>(inFeatures);
    checkWeights("lathe::linear_int8", packed, colSums, scales, bias, n, k);
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
    kernels::qlinear(xc.data_ptr<float>(), rows, k, layer, y.data_ptr<float>(), n, relu,
                     checkedScale(inputScale));
    return y;
}

at::Tensor conv2dInt8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& colSums,
                      const at::Tensor& scales, const c10::optional<at::Tensor>& bias, int64_t outChannels,
                      int64_t inChannels, at::IntArrayRef kernel, at::IntArrayRef stride,
                      at::IntArrayRef padding, at::IntArrayRef dilation, bool relu, double inputScale) {
    auto pair = [](at::IntArrayRef v, int64_t lo, const char* what) {
        TORCH_CHECK(v.size() == 2 && v[0] >= lo && v[1] >= lo && v[0] <= 4096 && v[1] <= 4096,
                    "lathe::conv2d_int8: ", what, " must be two values of ", lo, "..4096 (got ", v, ")");
    };
    pair(kernel, 1, "kernel");
    pair(stride, 1, "stride");
    pair(padding, 0, "padding");
    pair(dilation, 1, "dilation");
    TORCH_CHECK(inChannels >= 1 && outChannels >= 1 && outChannels <= (int64_t{1} << 24),
                "lathe::conv2d_int8: bad channel counts ", outChannels, " x ", inChannels);
    const int64_t kDepth = inChannels * kernel[0] * kernel[1];
    TORCH_CHECK(kDepth <= static_cast<int64_t>(kernels::kQMaxK), "lathe::conv2d_int8: ", kDepth,
                " values per output pixel, the int8 GEMM takes at most ", kernels::kQMaxK);
    const auto n = static_cast<size_t>(outChannels), k = static_cast<size_t>(kDepth);
    checkWeights("lathe::conv2d_int8", packed, colSums, scales, bias, n, k);
    TORCH_CHECK(x.device().is_cpu(), "lathe::conv2d_int8 runs on the CPU (input on ", x.device(), ")");
    TORCH_CHECK(x.dim() == 4 && x.size(1) == inChannels, "lathe::conv2d_int8: input must be [N, ", inChannels,
                ", H, W] (got ", x.sizes(), ")");
    const int64_t batch = x.size(0), h = x.size(2), w = x.size(3);
    const int64_t oh = (h + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) / stride[0] + 1;
    const int64_t ow = (w + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) / stride[1] + 1;
    TORCH_CHECK(oh >= 1 && ow >= 1, "lathe::conv2d_int8: a ", h, "x", w, " input is smaller than the kernel");
    auto y = at::empty({batch, oh, ow, outChannels}, x.options().dtype(at::kFloat));
    if (batch == 0) return y.permute({0, 3, 1, 2});
    // Each output pixel's receptive field as a row (C, kh, kw order: the weight's), then one GEMM.
    const auto rows =
        at::im2col(x.to(at::kFloat), kernel, dilation, padding, stride).transpose(1, 2).contiguous();
    const kernels::QLinear layer{packed.data_ptr<std::int8_t>(),
                                 colSums.data_ptr<std::int32_t>(),
                                 scales.data_ptr<float>(),
                                 bias && bias->defined() ? bias->data_ptr<float>() : nullptr,
                                 n,
                                 k};
    kernels::qlinear(rows.data_ptr<float>(), static_cast<size_t>(batch * oh * ow), k, layer,
                     y.data_ptr<float>(), n, relu, checkedScale(inputScale));
    return y.permute({0, 3, 1, 2}).contiguous();
}

namespace {
thread_local ObserveFn* t_observe = nullptr;
}  // namespace

ObserveScope::ObserveScope(ObserveFn fn) : m_fn(std::move(fn)), m_previous(t_observe) { t_observe = &m_fn; }
ObserveScope::~ObserveScope() { t_observe = m_previous; }

at::Tensor observe(const at::Tensor& x, int64_t id) {
    if (t_observe && *t_observe) (*t_observe)(id, x);
    return x;
}

void ensureQuantizedOpsRegistered() {}

TORCH_LIBRARY(lathe, m) {
    m.def(
        "linear_int8(Tensor x, Tensor packed, Tensor col_sums, Tensor scales, Tensor? bias, int "
        "out_features, "
        "int in_features, bool relu=False, float input_scale=0.0) -> Tensor");
    m.def(
        "conv2d_int8(Tensor x, Tensor packed, Tensor col_sums, Tensor scales, Tensor? bias, int "
        "out_channels, "
        "int in_channels, int[2] kernel, int[2] stride, int[2] padding, int[2] dilation, bool relu=False, "
        "float input_scale=0.0) -> Tensor");
    m.def("observe(Tensor x, int id) -> Tensor");
}

TORCH_LIBRARY_IMPL(lathe, CPU, m) {
    m.impl("linear_int8", &linearInt8);
    m.impl("conv2d_int8", &conv2dInt8);
    m.impl("observe", &observe);
}

}  // namespace lathe::core::compression
