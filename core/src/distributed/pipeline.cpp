// Pipeline parallelism: cutting the network into stages, the micro-batch schedules and the
// activations and gradients that travel between neighbouring stages (pipeline.h).
#include "distributed/pipeline.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>

#include "distributed/process_group_impl.h"
#include "lathe/core/error.h"
#include "training/amp.h"
#include "training/profiler.h"

namespace lathe::core {

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Layer i of a Sequential as the AnyModule it holds (operator[] gives only the Module).
torch::nn::AnyModule& layer(torch::nn::Sequential& model, int64_t i) { return *(model->begin() + i); }

bool hasParameters(const std::shared_ptr<torch::nn::Module>& m) { return !m->parameters().empty(); }

// Tags of one micro-batch's messages: its activation forward and its gradient back.
int activationTag(int micro) { return 2 * micro; }
int gradientTag(int micro) { return 2 * micro + 1; }

}  // namespace

std::vector<int64_t> pipelineUnits(torch::nn::Sequential& model) {
    std::vector<int64_t> starts;
    const auto n = static_cast<int64_t>(model->size());
    bool seenParams = false;
    for (int64_t i = 0; i < n; ++i) {
        if (!hasParameters(model->ptr(static_cast<size_t>(i)))) continue;
        // The first unit also takes the parameter-free layers in front of it (a Flatten).
        starts.push_back(seenParams ? i : 0);
        seenParams = true;
    }
    if (starts.empty()) starts.push_back(0);
    starts.push_back(n);
    return starts;
}

StageBounds balanceStages(const std::vector<int64_t>& unitStarts, const std::vector<double>& weights,
                          int stages) {
    const auto units = static_cast<int>(unitStarts.size()) - 1;
    if (stages < 1) throw ConfigError("`pipeline_stages` must be at least 1");
    if (units < stages)
        throw ConfigError("`pipeline_stages` " + std::to_string(stages) + ": the model has only " +
                          std::to_string(units) + " layer(s) with parameters, so at most " +
                          std::to_string(units) + " stage(s); use fewer stages or a deeper model");
    // best[k][j]: the heaviest part when units [0, j) are cut into k parts; cut[k][j] where the
    // last of them starts. Ties go to the later cut, so earlier stages are never heavier than needed.
    std::vector<double> prefix(static_cast<size_t>(units) + 1, 0.0);
    for (int u = 0; u < units; ++u)
        prefix[static_cast<size_t>(u) + 1] = prefix[static_cast<size_t>(u)] + weights[static_cast<size_t>(u)];
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                          std::vector<double>(static_cast<size_t>(units) + 1, inf));
    std::vector<std::vector<int>> cut(static_cast<size_t>(stages) + 1,
                                      std::vector<int>(static_cast<size_t>(units) + 1, 0));
    best[0][0] = 0;
    for (int k = 1; k <= stages; ++k)
        for (int j = k; j <= units; ++j)
            for (int i = k - 1; i < j; ++i) {
                const double part = prefix[static_cast<size_t>(j)] - prefix[static_cast<size_t>(i)];
                const double worst = std::max(best[static_cast<size_t>(k) - 1][static_cast<size_t>(i)], part);
                if (worst <= best[static_cast<size_t>(k)][static_cast<size_t>(j)]) {
                    best[static_cast<size_t>(k)][static_cast<size_t>(j)] = worst;
                    cut[static_cast<size_t>(k)][static_cast<size_t>(j)] = i;
                }
            }
    std::vector<int> firstUnit(static_cast<size_t>(stages) + 1);
    firstUnit[static_cast<size_t>(stages)] = units;
    for (int k = stages, j = units; k > 0; --k) {
        j = cut[static_cast<size_t>(k)][static_cast<size_t>(j)];
        firstUnit[static_cast<size_t>(k) - 1] = j;
    }
    StageBounds bounds;
    for (int u : firstUnit) bounds.push_back(unitStarts[static_cast<size_t>(u)]);
    return bounds;
}

std::vector<double> unitParameterWeights(torch::nn::Sequential& model, const std::vector<int64_t>& units) {
    std::vector<double> w;
    for (size_t u = 0; u + 1 < units.size(); ++u) {
        double n = 0;
        for (int64_t i = units[u]; i < units[u + 1]; ++i)
            for (const auto& p : model->ptr(static_cast<size_t>(i))->parameters())
                n += static_cast<double>(p.numel());
        w.push_back(n);
    }
    return w;
}

std::vector<double> unitTimeWeights(torch::nn::Sequential& model, const std::vector<int64_t>& units,
                                    const torch::Tensor& sample) {
    // Each unit's input, from one forward pass of the whole network.
    std::vector<torch::Tensor> inputs;
    {
        torch::NoGradGuard noGrad;
        torch::Tensor h = sample;
        for (size_t u = 0; u + 1 < units.size(); ++u) {
            inputs.push_back(h);
            for (int64_t i = units[u]; i < units[u + 1]; ++i) h = layer(model, i).forward(h);
        }
    }
    std::vector<double> w;
    constexpr int kRuns = 5;
    for (size_t u = 0; u + 1 < units.size(); ++u) {
        std::vector<double> runs;
        for (int r = 0; r < kRuns + 1; ++r) {  // the first run warms up
            // The network's input needs no gradient in training: the first unit skips it here too.
            auto x = inputs[u].detach().requires_grad_(u > 0 && inputs[u].is_floating_point());
            const auto t0 = Clock::now();
            torch::Tensor h = x;
            for (int64_t i = units[u]; i < units[u + 1]; ++i) h = layer(model, i).forward(h);
            h.to(torch::kFloat).sum().backward();
            if (r > 0) runs.push_back(msSince(t0));
        }
        std::nth_element(runs.begin(), runs.begin() + kRuns / 2, runs.end());
        w.push_back(runs[kRuns / 2]);
    }
    model->zero_grad();
    return w;
}

torch::nn::Sequential stageModel(torch::nn::Sequential& model, int64_t begin, int64_t end) {
    torch::nn::Sequential stage;
    for (int64_t i = begin; i < end; ++i) stage->push_back(std::to_string(i), layer(model, i));
    return stage;
}

std::vector<BoundaryShape> boundaryShapes(torch::nn::Sequential& model, const StageBounds& bounds,
                                          const torch::Tensor& sample1,
                                          c10::optional<c10::ScalarType> autocast, c10::DeviceType device) {
    torch::NoGradGuard noGrad;
    std::optional<AutocastGuard> cast;
    if (autocast) cast.emplace(device, *autocast);
    std::vector<BoundaryShape> out;
    torch::Tensor h = sample1;
    auto describe = [](const torch::Tensor& t) {
        BoundaryShape b;
        b.shape.assign(t.sizes().begin() + 1, t.sizes().end());
        b.dtype = t.scalar_type();
        return b;
    };
    for (size_t s = 0; s + 1 < bounds.size(); ++s) {
        out.push_back(describe(h));
        for (int64_t i = bounds[s]; i < bounds[s + 1]; ++i) h = layer(model, i).forward(h);
    }
    out.push_back(describe(h));  // the logits
    return out;
}

std::vector<PipeOp> pipelineSchedule(const std::string& schedule, int stage, int stages, int micro) {
    std::vector<PipeOp> ops;
    if (schedule == "gpipe") {
        for (int i = 0; i < micro; ++i) ops.push_back({true, i});
        for (int i = micro; i-- > 0;) ops.push_back({false, i});
        return ops;
    }
    if (schedule != "1f1b")
        throw ConfigError("`pipeline_schedule` must be gpipe or 1f1b (got '" + schedule + "')");
    // PipeDream-Flush: fill the pipe, then alternate, then drain.
    const int warmup = std::min(stages - stage - 1, micro);
    for (int i = 0; i < warmup; ++i) ops.push_back({true, i});
    for (int i = 0; i < micro - warmup; ++i) {
        ops.push_back({true, warmup + i});
        ops.push_back({false, i});
    }
    for (int i = micro - warmup; i < micro; ++i) ops.push_back({false, i});
    return ops;
}

PipelineStage::PipelineStage(DistContext& group, torch::nn::Sequential stage,
                             std::vector<BoundaryShape> boundaries, Options options)
    : m_group(group),
      m_model(std::move(stage)),
      m_boundaries(std::move(boundaries)),
      m_options(std::move(options)),
      m_stage(group.rank()),
      m_stages(group.worldSize()) {
    if (static_cast<int>(m_boundaries.size()) != m_stages + 1)
        throw Error("pipeline: " + std::to_string(m_boundaries.size()) + " boundary shapes for " +
                    std::to_string(m_stages) + " stages");
    m_sendThread = std::thread([this] { sendLoop(); });
}

void PipelineStage::send(torch::Tensor t, int to, int tag) {
    t = t.detach().contiguous();
    if (t.device() != m_group.commDevice()) t = t.to(m_group.commDevice());
    std::vector<at::Tensor> one{t};
    auto work = m_group.impl().pg->send(one, to, tag);
    {
        std::lock_guard<std::mutex> lk(m_sendMutex);
        m_sends.push_back(std::move(work));  // the work holds the tensor until the send is done
        ++m_sendsPending;
    }
    m_sendCv.notify_all();
    m_bytesSent += static_cast<int64_t>(t.numel() * t.element_size());
}

torch::Tensor PipelineStage::receive(int from, int tag, int64_t rows, const BoundaryShape& b) {
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), b.shape.begin(), b.shape.end());
    std::vector<at::Tensor> one{
        torch::empty(shape, torch::TensorOptions().dtype(b.dtype).device(m_group.commDevice()))};
    m_group.impl().pg->recv(one, from, tag)->wait();
    return one[0].device() == m_options.device ? one[0] : one[0].to(m_options.device);
}

// A send completes once the neighbour has received it (Gloo's send waits for the posted receive).
// This thread waits for them in order and lets each tensor go as soon as it is received; holding
// them all to the end of the step would keep every micro-batch's activation and gradient alive,
// and 1F1B would hold as much as GPipe.
void PipelineStage::sendLoop() {
    for (;;) {
        c10::intrusive_ptr<c10d::Work> work;
        {
            std::unique_lock<std::mutex> lk(m_sendMutex);
            m_sendCv.wait(lk, [&] { return m_stopSends || !m_sends.empty(); });
            if (m_sends.empty()) return;
            work = m_sends.front();
        }
        std::exception_ptr error;
        try {
            work->wait();
        } catch (...) {
            error = std::current_exception();
        }
        {
            std::lock_guard<std::mutex> lk(m_sendMutex);
            m_sends.pop_front();
            --m_sendsPending;
            if (error && !m_sendError) m_sendError = error;
        }
        work.reset();
        m_sendCv.notify_all();
    }
}

void PipelineStage::waitSends() {
    std::unique_lock<std::mutex> lk(m_sendMutex);
    m_sendCv.wait(lk, [&] { return m_sendsPending == 0; });
    if (m_sendError) {
        auto e = m_sendError;
        m_sendError = nullptr;
        std::rethrow_exception(e);
    }
}

PipelineStage::~PipelineStage() {
    {
        std::lock_guard<std::mutex> lk(m_sendMutex);
        m_stopSends = true;
    }
    m_sendCv.notify_all();
    if (m_sendThread.joinable()) m_sendThread.join();
}

PipelineStage::StepStats PipelineStage::step(const torch::Tensor& x, const torch::Tensor& y,
                                             int64_t batchRows, const LossFn& lossFn, const ScaleFn& scale,
                                             Profiler* profiler) {
    StepStats st;
    const int micro = static_cast<int>(std::min<int64_t>(m_options.microBatches, batchRows));
    st.microBatches = micro;
    // The same split on every stage: the first rows % micro micro-batches take one row more.
    std::vector<int64_t> rows(static_cast<size_t>(micro), batchRows / micro),
        offset(static_cast<size_t>(micro), 0);
    for (int i = 0; i < micro; ++i) {
        if (i < batchRows % micro) ++rows[static_cast<size_t>(i)];
        if (i > 0)
            offset[static_cast<size_t>(i)] =
                offset[static_cast<size_t>(i) - 1] + rows[static_cast<size_t>(i) - 1];
    }
    std::vector<torch::Tensor> inputs(static_cast<size_t>(micro)), outputs(static_cast<size_t>(micro));
    m_bytesSent = 0;
    int inFlight = 0;
    double lossSum = 0;
    const auto t0 = Clock::now();
    for (const auto& op : pipelineSchedule(m_options.schedule, m_stage, m_stages, micro)) {
        const auto i = static_cast<size_t>(op.micro);
        if (op.forward) {
            torch::Tensor in = first() ? x.narrow(0, offset[i], rows[i])
                                       : receive(m_stage - 1, activationTag(op.micro), rows[i],
                                                 m_boundaries[static_cast<size_t>(m_stage)]);
            if (!first() && in.is_floating_point()) in.requires_grad_(true);
            const auto c0 = Clock::now();
            {
                PhaseScope phase(profiler, "forward");
                torch::Tensor out;
                {
                    std::optional<AutocastGuard> autocast;
                    if (m_options.forward.autocast)
                        autocast.emplace(m_options.device.type(), *m_options.forward.autocast);
                    out = forwardModel(m_model, in, m_options.forward);
                }
                if (last()) {
                    // The micro-batch's mean loss weighted by its share of the batch: the sum over
                    // micro-batches is the batch's mean loss, as one process computes it.
                    const auto logits = out.to(torch::kFloat);
                    const auto labels = y.narrow(0, offset[i], rows[i]);
                    out = lossFn(logits, labels) *
                          (static_cast<double>(rows[i]) / static_cast<double>(batchRows));
                    lossSum += out.item<double>();
                    st.correct += logits.detach().argmax(1).eq(labels).sum().item<int64_t>();
                }
                inputs[i] = in;
                outputs[i] = out;
            }
            st.forwardMs += msSince(c0);
            if (!last()) send(outputs[i], m_stage + 1, activationTag(op.micro));
            st.maxInFlight = std::max(st.maxInFlight, ++inFlight);
        } else {
            torch::Tensor grad;
            if (!last())
                grad = receive(m_stage + 1, gradientTag(op.micro), rows[i],
                               m_boundaries[static_cast<size_t>(m_stage) + 1]);
            const auto c0 = Clock::now();
            {
                PhaseScope phase(profiler, "backward");
                if (last())
                    scale(outputs[i]).backward();
                else
                    outputs[i].backward(grad);
            }
            st.backwardMs += msSince(c0);
            if (!first()) {
                const auto& g = inputs[i].grad();
                send(g.defined() ? g : torch::zeros_like(inputs[i]), m_stage - 1, gradientTag(op.micro));
            }
            inputs[i] = torch::Tensor();  // this micro-batch's activations can go
            outputs[i] = torch::Tensor();
            --inFlight;
        }
    }
    waitSends();
    st.stepMs = msSince(t0);
    st.loss = lossSum;
    st.bytesSent = m_bytesSent;
    st.bubble = st.stepMs > 0 ? std::clamp(1.0 - (st.forwardMs + st.backwardMs) / st.stepMs, 0.0, 1.0) : 0.0;
    return st;
}

torch::Tensor PipelineStage::forward(const torch::Tensor& x, int64_t rows) {
    torch::NoGradGuard noGrad;
    torch::Tensor in =
        first() ? x
                : receive(m_stage - 1, activationTag(0), rows, m_boundaries[static_cast<size_t>(m_stage)]);
    torch::Tensor out;
    {
        std::optional<AutocastGuard> autocast;
        if (m_options.forward.autocast)
            autocast.emplace(m_options.device.type(), *m_options.forward.autocast);
        out = m_model->forward(in);
    }
    if (!last()) {
        send(out, m_stage + 1, activationTag(0));
        waitSends();
        return {};
    }
    return out.to(torch::kFloat);
}

}  // namespace lathe::core
