// The trainer: LibTorch training loop behind the torch-free facade in training.h.
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "checkpoint_io.h"
#include "data/raw.h"
#include "lathe/core/error.h"
#include "lathe/core/training.h"
#include "models.h"

namespace lathe::core {
namespace {

using Clock = std::chrono::steady_clock;

struct Tensors {
    torch::Tensor x, y;
    int64_t size() const { return y.size(0); }
};

Tensors toTensors(data::RawSet& raw) {
    std::vector<int64_t> shape{raw.size()};
    shape.insert(shape.end(), raw.shape.begin(), raw.shape.end());
    Tensors t;
    t.x = torch::from_blob(raw.x.data(), shape, torch::kFloat32).clone();
    t.y = torch::from_blob(raw.y.data(), {raw.size()}, torch::kInt64).clone();
    return t;
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const RunSpec& spec, const std::vector<torch::Tensor>& params) {
    if (spec.optimizer == "sgd")
        return std::make_unique<torch::optim::SGD>(
            params, torch::optim::SGDOptions(spec.lr).momentum(spec.momentum).weight_decay(spec.weightDecay));
    if (spec.optimizer == "adam")
        return std::make_unique<torch::optim::Adam>(params,
                                                    torch::optim::AdamOptions(spec.lr).weight_decay(spec.weightDecay));
    if (spec.optimizer == "adamw")
        return std::make_unique<torch::optim::AdamW>(params,
                                                     torch::optim::AdamWOptions(spec.lr).weight_decay(spec.weightDecay));
    throw ConfigError("`optimizer` must be one of sgd, adam, adamw (got '" + spec.optimizer + "')");
}

// Learning rate for the step about to run: the schedule's value, ramped linearly during warm-up.
double learningRate(const RunSpec& spec, int64_t step, int64_t epoch, int64_t totalSteps) {
    double lr = spec.lr;
    if (spec.schedule == "step") {
        lr = spec.lr * std::pow(spec.gamma, static_cast<double>(epoch / spec.stepEpochs));
    } else if (spec.schedule == "cosine") {
        const double span = static_cast<double>(std::max<int64_t>(1, totalSteps - spec.warmupSteps));
        const double progress = std::clamp(static_cast<double>(step - spec.warmupSteps) / span, 0.0, 1.0);
        lr = spec.minLr + (spec.lr - spec.minLr) * 0.5 * (1.0 + std::cos(M_PI * progress));
    }
    if (step < spec.warmupSteps) lr *= static_cast<double>(step + 1) / static_cast<double>(spec.warmupSteps);
    return lr;
}

struct EvalResult {
    double loss = 0, accuracy = 0;
};

EvalResult evaluate(torch::nn::Sequential& model, const Tensors& data) {
    torch::NoGradGuard noGrad;
    model->eval();
    double lossSum = 0;
    int64_t correct = 0;
    const int64_t n = data.size();
    for (int64_t i = 0; i < n; i += 1024) {
        const int64_t end = std::min(n, i + 1024);
        auto xb = data.x.slice(0, i, end);
        auto yb = data.y.slice(0, i, end);
        auto out = model->forward(xb);
        lossSum += torch::nn::functional::cross_entropy(
                       out, yb, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                       .item<double>();
        correct += out.argmax(1).eq(yb).sum().item<int64_t>();
    }
    model->train();
    return {lossSum / static_cast<double>(n), static_cast<double>(correct) / static_cast<double>(n)};
}

// LibTorch's intra-op threads do not bound OpenBLAS's own pool, which then oversubscribes the
// cores. OpenBLAS is the BLAS we install, but not one we link directly (Debian picks it
// through the libblas.so.3 alternative), so it is looked up at run time.
void setThreads(int n) {
    torch::set_num_threads(n);
    using SetFn = void (*)(int);
    if (auto fn = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(n);
}

std::string fmt(double v, int prec = 4) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    return buf;
}

}  // namespace

TrainResult train(const RunSpec& spec, const TrainOptions& options, const EventSink& sink) {
    validateOrThrow(spec);
    auto emit = [&](Event e) {
        if (sink) sink(e);
    };
    auto metric = [&](const std::string& key, int64_t step, double value, std::map<std::string, double>& last) {
        emit(Event::metric(key, step, value));
        last[key] = value;
    };

    if (spec.threads > 0) setThreads(static_cast<int>(spec.threads));
    torch::manual_seed(static_cast<uint64_t>(spec.seed));

    auto split = data::loadSplit(spec);
    const auto sampleShape = split.train.shape;
    const auto numClasses = static_cast<int64_t>(split.train.classNames.size());
    Tensors trainSet = toTensors(split.train);
    Tensors valSet = toTensors(split.val);
    split = {};

    auto model = makeModel(spec, sampleShape, numClasses);
    auto optimizer = makeOptimizer(spec, model->parameters());

    TrainResult result;
    int64_t startEpoch = 0;
    int64_t step = 0;
    if (!options.resumeFrom.empty()) {
        const auto info = loadCheckpoint(options.resumeFrom, *model, *optimizer);
        startEpoch = info.epoch;
        step = info.step;
        emit(Event::log("info", "resumed from " + info.path + " at epoch " + std::to_string(info.epoch) +
                                    ", step " + std::to_string(info.step)));
    }

    const int64_t nTrain = trainSet.size();
    const int64_t stepsPerEpoch = (nTrain + spec.batch - 1) / spec.batch;
    const int64_t totalSteps = stepsPerEpoch * spec.epochs;
    {
        Event running = Event::status("running");
        running.step = step;
        running.value = static_cast<double>(totalSteps);
        emit(running);
    }
    emit(Event::log("info", spec.model + " (" + std::to_string(parameterCount(*model)) + " parameters) on " +
                                spec.data + ": " + std::to_string(nTrain) + " training / " +
                                std::to_string(valSet.size()) + " validation samples, " +
                                std::to_string(numClasses) + " classes, " + std::to_string(stepsPerEpoch) +
                                " steps per epoch"));
    if (startEpoch >= spec.epochs) {
        result.status = "completed";
        result.epochsDone = startEpoch;
        result.steps = step;
        emit(Event::log("info", "checkpoint already covers all " + std::to_string(spec.epochs) + " epochs"));
        emit(Event::status("completed"));
        return result;
    }

    auto saveCkpt = [&](int64_t epochsDone) {
        if (options.checkpointDir.empty()) return;
        const auto info =
            saveCheckpoint(options.checkpointDir + "/last.ckpt", *model, *optimizer, epochsDone, step);
        emit(Event::checkpoint(info.path, info.sha256, step, epochsDone));
    };

    std::map<std::string, double>& last = result.finalMetrics;
    model->train();
    bool stopped = false;
    int64_t epochsDone = startEpoch;
    for (int64_t epoch = startEpoch; epoch < spec.epochs && !stopped; ++epoch) {
        // The order depends only on (seed, epoch), so a resumed run sees the same batches.
        std::vector<int64_t> order(static_cast<size_t>(nTrain));
        std::iota(order.begin(), order.end(), 0);
        std::mt19937_64 rng(static_cast<uint64_t>(spec.seed) * 1000003ull + static_cast<uint64_t>(epoch));
        std::shuffle(order.begin(), order.end(), rng);
        auto perm = torch::from_blob(order.data(), {nTrain}, torch::kInt64);

        double windowLoss = 0;
        int64_t windowSteps = 0, correct = 0, seen = 0, epochSteps = 0;
        double stepSeconds = 0;
        for (int64_t b = 0; b < stepsPerEpoch; ++b) {
            if (options.stop && options.stop->load(std::memory_order_relaxed)) {
                stopped = true;
                break;
            }
            const auto t0 = Clock::now();
            const double lr = learningRate(spec, step, epoch, totalSteps);
            for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
            auto idx = perm.slice(0, b * spec.batch, std::min(nTrain, (b + 1) * spec.batch));
            auto xb = trainSet.x.index_select(0, idx);
            auto yb = trainSet.y.index_select(0, idx);
            optimizer->zero_grad();
            auto out = model->forward(xb);
            auto loss = torch::nn::functional::cross_entropy(out, yb);
            loss.backward();
            if (spec.clipGradNorm > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), spec.clipGradNorm);
            optimizer->step();
            const double lossValue = loss.item<double>();
            correct += out.detach().argmax(1).eq(yb).sum().item<int64_t>();
            stepSeconds += std::chrono::duration<double>(Clock::now() - t0).count();
            seen += idx.size(0);
            ++step;
            ++epochSteps;
            if (!std::isfinite(lossValue)) {
                metric("train/loss", step, lossValue, last);
                result.status = "failed";
                result.error = "loss became " + fmt(lossValue) + " at step " + std::to_string(step) +
                               " (epoch " + std::to_string(epoch + 1) + "); lower `lr` (now " + fmt(lr) +
                               ") or set `clip_grad_norm`";
                emit(Event::error(result.error));
                emit(Event::status("failed"));
                result.epochsDone = epochsDone;
                result.steps = step;
                return result;
            }
            windowLoss += lossValue;
            ++windowSteps;
            if (step % spec.logEvery == 0 || b + 1 == stepsPerEpoch) {
                metric("train/loss", step, windowLoss / static_cast<double>(windowSteps), last);
                windowLoss = 0;
                windowSteps = 0;
            }
        }
        if (epochSteps == 0) break;  // stopped before this epoch did anything
        const auto val = evaluate(model, valSet);
        metric("train/accuracy", step, static_cast<double>(correct) / static_cast<double>(seen), last);
        metric("val/loss", step, val.loss, last);
        metric("val/accuracy", step, val.accuracy, last);
        metric("train/lr", step, learningRate(spec, step - 1, epoch, totalSteps), last);
        metric("perf/step_ms", step, 1000.0 * stepSeconds / static_cast<double>(epochSteps), last);
        metric("perf/samples_per_s", step, static_cast<double>(seen) / std::max(stepSeconds, 1e-9), last);
        metric("train/epoch", step, static_cast<double>(epoch + 1), last);
        if (!stopped) {
            epochsDone = epoch + 1;
            const bool lastEpoch = epoch + 1 == spec.epochs;
            if (lastEpoch || (spec.checkpointEvery > 0 && (epoch + 1) % spec.checkpointEvery == 0))
                saveCkpt(epoch + 1);
        }
    }
    result.epochsDone = epochsDone;
    result.steps = step;
    result.status = stopped ? "stopped" : "completed";
    emit(Event::log("info", "training " + result.status + " after " + std::to_string(step) + " steps"));
    emit(Event::status(result.status));
    return result;
}

}  // namespace lathe::core
