// lathe::linear_int8 on the kernels' int8 GEMM (quantized_ops.h).
#include "quantized_ops.h"

#include <torch/library.h>

#include <algorithm>
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

// y (rows x n fp32) as the int8 codes of scale `scale` the next layer would make of it (the
// quantizeRows definition), in a Char tensor of y's shape.
at::Tensor codesOf(const at::Tensor& y, size_t rows, size_t n, float scale) {
    auto codes = at::empty(y.sizes(), y.options().dtype(at::kChar));
    std::vector<float> unused(rows);
    kernels::quantizeRows(y.data_ptr<float>(), rows, n, n, codes.data_ptr<std::int8_t>(), n, unused.data(),
                          scale);
    return codes;
}

// Receptive fields of int8 codes x[batch][c][h][w] as rows of a (stride lda; bytes past the
// fields are left as they are): row (b, oy, ox) holds, in (c, ky, kx) order, the code under each
// kernel tap, 0 (the code of 0) where the tap falls in the padding. Each input plane is first
// copied into a zero-bordered one, so the gathering needs no bounds checks; a 3-wide kernel of
// dilation 1 (the common case) copies each kernel row as 3 bytes.
void im2colCodes(const std::int8_t* x, int64_t batch, int64_t channels, int64_t h, int64_t w,
                 at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding,
                 at::IntArrayRef dilation, int64_t oh, int64_t ow, std::int8_t* a, size_t lda) {
    // Locals: int8 stores may alias anything, so fields read through the refs would be reloaded.
    const int64_t kh = kernel[0], kw = kernel[1], sy = stride[0], sx = stride[1], py = padding[0],
                  px = padding[1], dy = dilation[0], dx = dilation[1];
    // The bordered plane covers every tap position: rows -py .. (oh-1)*sy-py+(kh-1)*dy.
    const int64_t hp = std::max(h + py, (oh - 1) * sy + (kh - 1) * dy + 1) + py;
    const int64_t wp = std::max(w + px, (ow - 1) * sx + (kw - 1) * dx + 1) + px;
    thread_local std::vector<std::int8_t> bordered;
    bordered.assign(static_cast<size_t>(hp * wp), 0);
    const bool three = kw == 3 && dx == 1;
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t c = 0; c < channels; ++c) {
            const std::int8_t* plane = x + (b * channels + c) * h * w;
            std::int8_t* __restrict pp = bordered.data();
            for (int64_t y = 0; y < h; ++y) std::memcpy(pp + (y + py) * wp + px, plane + y * w, w);
            for (int64_t oy = 0; oy < oh; ++oy)
                for (int64_t ox = 0; ox < ow; ++ox) {
                    std::int8_t* __restrict dst =
                        a + static_cast<size_t>((b * oh + oy) * ow + ox) * lda + c * kh * kw;
                    const std::int8_t* src = pp + oy * sy * wp + ox * sx;
                    for (int64_t ky = 0; ky < kh; ++ky, dst += kw, src += dy * wp) {
                        if (three)
                            std::memcpy(dst, src, 3);
                        else
                            for (int64_t kx = 0; kx < kw; ++kx) dst[kx] = src[kx * dx];
                    }
                }
        }
}

// [B, H, W, C] (contiguous) as a contiguous [B, C, H, W] tensor. ATen's permute().contiguous()
// copies element by element through strides and took longer than the int8 GEMM it follows.
template <class T>
at::Tensor toNchw(const at::Tensor& nhwc) {
    const int64_t b = nhwc.size(0), h = nhwc.size(1), w = nhwc.size(2), c = nhwc.size(3), plane = h * w;
    auto out = at::empty({b, c, h, w}, nhwc.options());
    const T* __restrict src = nhwc.data_ptr<T>();
    T* __restrict dst = out.data_ptr<T>();
    constexpr int64_t kTile = 16;  // pixels per pass: each channel's row gets 16 consecutive values
    for (int64_t i = 0; i < b; ++i, src += plane * c, dst += plane * c)
        for (int64_t p0 = 0; p0 < plane; p0 += kTile) {
            const int64_t p1 = std::min(plane, p0 + kTile);
            for (int64_t ch = 0; ch < c; ++ch)
                for (int64_t p = p0; p < p1; ++p) dst[ch * plane + p] = src[p * c + ch];
        }
    return out;
}

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
    return outScale > 0 ? codesOf(y, rows, n, outScale) : y;
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
    TORCH_CHECK(x.scalar_type() != at::kChar || inputScale > 0,
                "lathe::conv2d_int8: int8 input needs its input_scale");
    const float inScale = checkedScale(inputScale), outScale = checkedScale(outputScale);
    if (batch == 0) {
        auto empty = at::empty({batch, outChannels, oh, ow}, x.options().dtype(at::kFloat));
        return outScale > 0 ? empty.to(at::kChar) : empty;
    }
    const kernels::QLinear layer{packed.data_ptr<std::int8_t>(),
                                 colSums.data_ptr<std::int32_t>(),
                                 scales.data_ptr<float>(),
                                 bias && bias->defined() ? bias->data_ptr<float>() : nullptr,
                                 n,
                                 k};
    const auto rows = static_cast<size_t>(batch * oh * ow);
    // A static input scale: the input's int8 codes (given, or made once per value), then the
    // receptive fields gathered as codes. Every value gets the code quantizeRows would give it
    // after im2col (the code of a value depends only on it and the fixed scale), so this is the
    // fp32 path below to the bit, with a ninth of the quantizing and a quarter of the bytes.
    at::Tensor codes;
    if (x.scalar_type() == at::kChar) {
        codes = x.contiguous();
    } else if (inScale > 0) {
        const auto xf = x.to(at::kFloat).contiguous();
        codes = at::empty(xf.sizes(), xf.options().dtype(at::kChar));
        const auto planes = static_cast<size_t>(batch * inChannels), plane = static_cast<size_t>(h * w);
        std::vector<float> planeScales(planes);
        kernels::quantizeRows(xf.data_ptr<float>(), planes, plane, plane, codes.data_ptr<std::int8_t>(),
                              plane, planeScales.data(), inScale);
        // A NaN or inf makes its output pixels NaN on the fp32 path (the row's scale is NaN):
        // such an input takes that path.
        for (float ps : planeScales)
            if (!std::isfinite(ps)) codes = at::Tensor();
    }
    at::Tensor y;
    if (codes.defined()) {
        const size_t kp = kernels::qPaddedK(k);
        // Reused per thread: a fresh buffer of this size is fresh pages from the kernel each call.
        thread_local std::vector<std::int8_t> a;
        a.assign(rows * kp, 0);
        im2colCodes(codes.data_ptr<std::int8_t>(), batch, inChannels, h, w, kernel, stride, padding, dilation,
                    oh, ow, a.data(), kp);
        const std::vector<float> rowScales(rows, inScale);
        y = at::empty({batch, oh, ow, outChannels}, x.options().dtype(at::kFloat));
        kernels::qlinearQuantized(a.data(), rowScales.data(), rows, layer, y.data_ptr<float>(), n, relu);
        if (outScale > 0) y = codesOf(y, rows, n, outScale);
    } else {
        // Each output pixel's receptive field as an fp32 row (C, kh, kw order: the weight's), then
        // one GEMM quantizing each row.
        const auto fields =
            at::im2col(x.to(at::kFloat), kernel, dilation, padding, stride).transpose(1, 2).contiguous();
        y = runLayer("lathe::conv2d_int8", fields, rows, layer, relu, inputScale, outputScale,
                     {batch, oh, ow, outChannels});
    }
    return y.scalar_type() == at::kChar ? toNchw<std::int8_t>(y) : toNchw<float>(y);
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
