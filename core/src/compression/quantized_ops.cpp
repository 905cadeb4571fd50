// lathe::linear_int8 on the kernels' int8 GEMM (quantized_ops.h).
#include "quantized_ops.h"

#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

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

namespace {

// The layer on `rows` rows of x (fp32, or int8 codes of scale inputScale), written as fp32 into y,
// or, with outputScale > 0, as the int8 codes the next layer would make of it (the same
// quantizeRows definition), into the returned Char tensor of y's shape.
at::Tensor runLayer(const char* op, const at::Tensor& x, size_t rows, const kernels::QLinear& layer,
                    bool relu, double inputScale, double outputScale, std::vector<int64_t> outShape) {
    const size_t n = layer.n, k = layer.k, kp = kernels::qPaddedK(k);
    const float inScale = checkedScale(inputScale), outScale = checkedScale(outputScale);
    const bool codesIn = x.scalar_type() == at::kChar;
    TORCH_CHECK(!codesIn || inScale > 0, op, ": int8 input needs its input_scale");
    auto y = at::empty(outShape, x.options().dtype(at::kFloat));
    if (rows == 0) return outScale > 0 ? y.to(at::kChar) : y;
    if (codesIn) {
        // Codes from the previous layer: used as they are (copied only to pad a row to the GEMM's K).
        const auto xc = x.contiguous();
        const std::int8_t* a = xc.data_ptr<std::int8_t>();
        std::vector<std::int8_t> padded;
        if (kp != k) {
            padded.assign(rows * kp, 0);
            for (size_t r = 0; r < rows; ++r) std::memcpy(&padded[r * kp], a + r * k, k);
            a = padded.data();
        }
        const std::vector<float> rowScales(rows, inScale);
        kernels::qlinearQuantized(a, rowScales.data(), rows, layer, y.data_ptr<float>(), n, relu);
    } else {
        const auto xc = x.to(at::kFloat).contiguous();
        kernels::qlinear(xc.data_ptr<float>(), rows, k, layer, y.data_ptr<float>(), n, relu, inScale);
    }
    if (outScale <= 0) return y;
    auto codes = at::empty(outShape, x.options().dtype(at::kChar));
    std::vector<float> unused(rows);
    const size_t nq = kernels::qPaddedK(n);
    if (nq == n) {
        kernels::quantizeRows(y.data_ptr<float>(), rows, n, n, codes.data_ptr<std::int8_t>(), n,
                              unused.data(), outScale);
    } else {
        std::vector<std::int8_t> tmp(rows * nq);
        kernels::quantizeRows(y.data_ptr<float>(), rows, n, n, tmp.data(), nq, unused.data(), outScale);
        for (size_t r = 0; r < rows; ++r) std::memcpy(codes.data_ptr<std::int8_t>() + r * n, &tmp[r * nq], n);
    }
    return codes;
}

}  // namespace

at::Tensor linearInt8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& colSums,
                      const at::Tensor& scales, const c10::optional<at::Tensor>& bias, int64_t outFeatures,
                      int64_t inFeatures, bool relu, double inputScale, double outputScale) {
    TORCH_CHECK(outFeatures >= 1 && outFeatures <= (int64_t{1} << 24) && inFeatures >= 1 &&
                    inFeatures <= static_cast<int64_t>(kernels::kQMaxK),
                "lathe::linear_int8: bad layer size ", outFeatures, " x ", inFeatures);
    const auto n = static_cast<size_t>(outFeatures), k = static_cast<size_t>(inFeatures);
    checkWeights("lathe::linear_int8", packed, colSums, scales, bias, n, k);
    TORCH_CHECK(x.device().is_cpu(), "lathe::linear_int8 runs on the CPU (input on ", x.device(), ")");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) == inFeatures, "lathe::linear_int8: input has ",
                x.dim() ? x.size(-1) : 0, " features, the layer takes ", inFeatures);
    auto outShape = x.sizes().vec();
    outShape.back() = outFeatures;
    const auto rows = static_cast<size_t>(x.numel() / inFeatures);
    const kernels::QLinear layer{packed.data_ptr<std::int8_t>(),
                                 colSums.data_ptr<std::int32_t>(),
                                 scales.data_ptr<float>(),
                                 bias && bias->defined() ? bias->data_ptr<float>() : nullptr,
                                 n,
                                 k};
    return runLayer("lathe::linear_int8", x, rows, layer, relu, inputScale, outputScale, outShape);
}

at::Tensor conv2dInt8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& colSums,
                      const at::Tensor& scales, const c10::optional<at::Tensor>& bias, int64_t outChannels,
                      int64_t inChannels, at::IntArrayRef kernel, at::IntArrayRef stride,
                      at::IntArrayRef padding, at::IntArrayRef dilation, bool relu, double inputScale,
                      double outputScale) {
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
    // int8 codes from the previous layer: back to the values they stand for (exact: the codes
    // come back unchanged when the rows are quantized again with the same scale).
    TORCH_CHECK(x.scalar_type() != at::kChar || inputScale > 0,
                "lathe::conv2d_int8: int8 input needs its input_scale");
    const at::Tensor input = x.scalar_type() == at::kChar ? x.to(at::kFloat) * checkedScale(inputScale) : x;
    if (batch == 0) {
        auto empty = at::empty({batch, outChannels, oh, ow}, x.options().dtype(at::kFloat));
        return outputScale > 0 ? empty.to(at::kChar) : empty;
    }
    // Each output pixel's receptive field as a row (C, kh, kw order: the weight's), then one GEMM.
    const auto rows =
        at::im2col(input.to(at::kFloat), kernel, dilation, padding, stride).transpose(1, 2).contiguous();
    const kernels::QLinear layer{packed.data_ptr<std::int8_t>(),
                                 colSums.data_ptr<std::int32_t>(),
                                 scales.data_ptr<float>(),
                                 bias && bias->defined() ? bias->data_ptr<float>() : nullptr,
                                 n,
                                 k};
    const auto y = runLayer("lathe::conv2d_int8", rows, static_cast<size_t>(batch * oh * ow), layer, relu,
                            inputScale, outputScale, {batch, oh, ow, outChannels});
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
        "int in_features, bool relu=False, float input_scale=0.0, float output_scale=0.0) -> Tensor");
    m.def(
        "conv2d_int8(Tensor x, Tensor packed, Tensor col_sums, Tensor scales, Tensor? bias, int "
        "out_channels, "
        "int in_channels, int[2] kernel, int[2] stride, int[2] padding, int[2] dilation, bool relu=False, "
        "float input_scale=0.0, float output_scale=0.0) -> Tensor");
    m.def("observe(Tensor x, int id) -> Tensor");
}

TORCH_LIBRARY_IMPL(lathe, CPU, m) {
    m.impl("linear_int8", &linearInt8);
    m.impl("conv2d_int8", &conv2dInt8);
    m.impl("observe", &observe);
}

}  // namespace lathe::core::compression
