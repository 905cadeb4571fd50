#include "training/mlp_step.h"

#include <algorithm>
#include <cmath>

#ifdef LATHE_HAVE_CBLAS
#include <cblas.h>
#endif

namespace lathe::core {

namespace {

bool plainFloat(const torch::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat && t.is_contiguous() &&
           !t.is_sparse();
}

#ifdef LATHE_HAVE_CBLAS
// Row-major C[m,n] = alpha * op(A) op(B) + beta * C, as LibTorch's own matrix products (the same
// BLAS library: LibTorch links libblas.so.3, which this build links too).
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(lda),
                b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}
#endif

}  // namespace

MlpStep::MlpStep(std::vector<Layer> layers) : m_layers(std::move(layers)) {}
MlpStep::~MlpStep() = default;

std::unique_ptr<MlpStep> MlpStep::of(torch::nn::Sequential& model) {
#ifndef LATHE_HAVE_CBLAS
    (void)model;
    return nullptr;
#else
    std::vector<Layer> layers;
    bool flattens = false;
    for (size_t i = 0; i < model->size(); ++i) {
        const auto& m = model->ptr(i);
        if (auto* flatten = dynamic_cast<torch::nn::FlattenImpl*>(m.get())) {
            // Only a leading Flatten of every dimension after the batch's: a view of the input.
            if (i != 0 || flatten->options.start_dim() != 1 || flatten->options.end_dim() != -1)
                return nullptr;
            flattens = true;
        } else if (dynamic_cast<torch::nn::ReLUImpl*>(m.get())) {
            if (layers.empty() || layers.back().relu) return nullptr;
            layers.back().relu = true;
        } else if (typeid(*m) == typeid(torch::nn::LinearImpl)) {  // not a subclass (QAT's fake quantization)
            Layer l;
            l.linear = torch::nn::Linear(std::dynamic_pointer_cast<torch::nn::LinearImpl>(m));
            l.in = l.linear->options.in_features();
            l.out = l.linear->options.out_features();
            if (l.in <= 0 || l.out <= 0 || (!layers.empty() && layers.back().out != l.in)) return nullptr;
            for (const auto& other : layers)  // one module twice shares its weights: gradients add up
                if (other.linear.ptr() == l.linear.ptr()) return nullptr;
            layers.push_back(std::move(l));
        } else {
            return nullptr;  // anything else (dropout, normalization, convolutions): autograd's step
        }
    }
    if (layers.empty()) return nullptr;
    auto step = std::unique_ptr<MlpStep>(new MlpStep(std::move(layers)));
    step->m_flatten = flattens;
    return step->layersFit() ? std::move(step) : nullptr;
#endif
}

bool MlpStep::layersFit() const {
    for (const auto& l : m_layers) {
        const auto& w = l.linear->weight;
        const auto& b = l.linear->bias;
        if (!plainFloat(w) || !w.requires_grad() || w.dim() != 2 || w.size(0) != l.out || w.size(1) != l.in)
            return false;
        if (b.defined() && (!plainFloat(b) || !b.requires_grad() || b.dim() != 1 || b.size(0) != l.out))
            return false;
    }
    return true;
}

bool MlpStep::accepts(const torch::Tensor& x, const torch::Tensor& y) const {
    if (!plainFloat(x) || x.dim() < 2 || (x.dim() > 2 && !m_flatten) || x.size(0) == 0 ||
        x.numel() / x.size(0) != m_layers.front().in)
        return false;
    if (!y.defined() || !y.device().is_cpu() || y.scalar_type() != torch::kLong || !y.is_contiguous() ||
        y.dim() != 1 || y.size(0) != x.size(0))
        return false;
    if (!layersFit()) return false;  // still trainable fp32 of the same shapes (a model can be cast)
    const int64_t classes = m_layers.back().out;
    const int64_t* labels = y.data_ptr<int64_t>();
    for (int64_t i = 0; i < y.size(0); ++i)
        if (labels[i] < 0 || labels[i] >= classes) return false;
    return true;
}

void MlpStep::ensureBuffers(int64_t batch) {
    if (batch <= m_batch) return;
    // Room for the largest batch seen; smaller ones (an epoch's last) use the first rows.
    m_batch = batch;
    m_act.clear();
    m_grad.clear();
    for (const auto& l : m_layers) {
        m_act.push_back(torch::empty({batch, l.out}));
        m_grad.push_back(torch::empty({batch, l.out}));
    }
}

MlpStep::Result MlpStep::run(const torch::Tensor& x, const torch::Tensor& y, float lossScale) {
    Result result;
#ifdef LATHE_HAVE_CBLAS
    torch::NoGradGuard noGrad;
    const int64_t batch = x.size(0);
    ensureBuffers(batch);
    const size_t n = m_layers.size();

    // Forward: out = input W^T + b (the bias copied into each row, then the product added, as
    // LibTorch's addmm), then the ReLU in place.
    const float* input = x.data_ptr<float>();
    for (size_t l = 0; l < n; ++l) {
        const auto& layer = m_layers[l];
        float* out = m_act[l].data_ptr<float>();
        const auto& bias = layer.linear->bias;
        if (bias.defined()) {
            const float* b = bias.data_ptr<float>();
            for (int64_t i = 0; i < batch; ++i) std::copy(b, b + layer.out, out + i * layer.out);
        }
        gemm(false, true, batch, layer.out, layer.in, input, layer.in, layer.linear->weight.data_ptr<float>(),
             layer.in, bias.defined() ? 1.0f : 0.0f, out, layer.out);
        if (layer.relu)
            for (int64_t i = 0; i < batch * layer.out; ++i)
                out[i] = out[i] < 0.0f ? 0.0f : out[i];  // NaN stays
        input = out;
    }

    // Mean cross-entropy and its gradient w.r.t. the logits, as log_softmax + nll_loss and their
    // backward: log p = z - max - log(sum(exp(z - max))); d/dz = softmax - onehot, over the batch.
    const int64_t classes = m_layers.back().out;
    const float* z = m_act[n - 1].data_ptr<float>();
    float* gz = m_grad[n - 1].data_ptr<float>();
    const int64_t* labels = y.data_ptr<int64_t>();
    const float w = 1.0f / static_cast<float>(batch);
    const bool scaled = lossScale != 1.0f;
    double lossSum = 0;
    for (int64_t i = 0; i < batch; ++i) {
        const float* row = z + i * classes;
        float* g = gz + i * classes;
        const float mx = *std::max_element(row, row + classes);
        float sum = 0;
        for (int64_t j = 0; j < classes; ++j) sum += std::exp(row[j] - mx);
        const float logSum = std::log(sum);
        for (int64_t j = 0; j < classes; ++j) {
            const float logP = row[j] - mx - logSum;
            g[j] = (j == labels[i] ? -w : 0.0f) + std::exp(logP) * w;
            if (scaled) g[j] *= lossScale;
        }
        lossSum -= static_cast<double>(row[labels[i]] - mx - logSum);
    }
    result.loss = lossSum / static_cast<double>(batch);
    if (m_layers.back().relu)  // logits out of a ReLU: through its backward too
        for (int64_t i = 0; i < batch * classes; ++i)
            if (z[i] <= 0.0f) gz[i] = 0.0f;
    result.logits = m_act[n - 1].narrow(0, 0, batch);
    result.forwardDone = std::chrono::steady_clock::now();

    // Backward: per layer, dW = G^T A_in, db = the column sums of G, and G_in = G W masked by the
    // previous layer's ReLU (its output > 0, as ReLU's backward in LibTorch).
    for (size_t l = n; l-- > 0;) {
        const auto& layer = m_layers[l];
        const float* g = m_grad[l].data_ptr<float>();
        const float* in = l == 0 ? x.data_ptr<float>() : m_act[l - 1].data_ptr<float>();
        auto& weight = layer.linear->weight;
        auto& gw = weight.mutable_grad();
        if (!gw.defined() || !plainFloat(gw) || gw.sizes() != weight.sizes()) gw = torch::empty_like(weight);
        gemm(true, false, layer.out, layer.in, batch, g, layer.out, in, layer.in, 0.0f, gw.data_ptr<float>(),
             layer.in);
        auto& bias = layer.linear->bias;
        if (bias.defined()) {
            auto& gb = bias.mutable_grad();
            if (!gb.defined() || !plainFloat(gb) || gb.sizes() != bias.sizes()) gb = torch::empty_like(bias);
            float* db = gb.data_ptr<float>();
            std::fill(db, db + layer.out, 0.0f);
            for (int64_t i = 0; i < batch; ++i)
                for (int64_t j = 0; j < layer.out; ++j) db[j] += g[i * layer.out + j];
        }
        if (l == 0) break;
        float* gin = m_grad[l - 1].data_ptr<float>();
        gemm(false, false, batch, layer.in, layer.out, g, layer.out, weight.data_ptr<float>(), layer.in, 0.0f,
             gin, layer.in);
        if (m_layers[l - 1].relu) {
            const float* a = m_act[l - 1].data_ptr<float>();
            for (int64_t i = 0; i < batch * layer.in; ++i)
                if (a[i] <= 0.0f) gin[i] = 0.0f;
        }
    }
#else
    (void)x;
    (void)y;
    (void)lossScale;
#endif
    return result;
}

}  // namespace lathe::core
