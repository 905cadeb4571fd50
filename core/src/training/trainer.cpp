// The trainer: LibTorch training loop behind the torch-free facade in trainer.h (reached
// through torch_backend.h).
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "data/raw.h"
#include "distributed/reducer.h"
#include "lathe/core/error.h"
#include "lathe/core/trainer.h"
#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/scale_and_check.h"
#include "torch_backend.h"
#include "training/amp.h"
#include "training/checkpoint_io.h"
#include "training/loss_scaler.h"
#include "training/profiler.h"
#include "training/zoo.h"

namespace lathe::core {
// LibTorch's intra-op threads do not bound OpenBLAS's own pool, which then oversubscribes the
// cores. OpenBLAS is the BLAS we install, but not one we link directly (Debian picks it
// through the libblas.so.3 alternative), so it is looked up at run time.
void torch_impl::setComputeThreads(int n) {
    if (n <= 0) return;
    torch::set_num_threads(n);
    using SetFn = void (*)(int);
    if (auto fn = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(n);
}

namespace {

using Clock = std::chrono::steady_clock;

// The training objective, one definition for the step and for evaluation.
torch::Tensor classificationLoss(
    const torch::Tensor& logits, const torch::Tensor& labels,
    torch::nn::functional::CrossEntropyFuncOptions::reduction_t reduction = torch::kMean) {
    return torch::nn::functional::cross_entropy(
        logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(reduction));
}

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

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const RunSpec& spec,
                                                       const std::vector<torch::Tensor>& params) {
    if (spec.optimizer == "sgd")
        return std::make_unique<torch::optim::SGD>(
            params, torch::optim::SGDOptions(spec.lr).momentum(spec.momentum).weight_decay(spec.weightDecay));
    if (spec.optimizer == "adam")
        return std::make_unique<torch::optim::Adam>(
            params, torch::optim::AdamOptions(spec.lr).weight_decay(spec.weightDecay));
    if (spec.optimizer == "adamw")
        return std::make_unique<torch::optim::AdamW>(
            params, torch::optim::AdamWOptions(spec.lr).weight_decay(spec.weightDecay));
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

}  // namespace

int torch_impl::cudaDeviceCount() noexcept {
    try {
        return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    } catch (...) {
        return 0;
    }
}

namespace {

// A data-parallel rank on CUDA takes GPU LOCAL_RANK (modulo the GPUs there are), as torchrun's
// convention has it.
torch::Device resolveDevice(const RunSpec& spec, const DistEnv& dist = {}) {
    const bool cuda = torch::cuda::is_available();
    if (spec.device == "cuda" && !cuda)
        throw ConfigError(
            "`device` cuda: no CUDA device is available (this LibTorch or this machine has none); use "
            "device = \"cpu\" or \"auto\"");
    const int gpus = cuda ? static_cast<int>(torch::cuda::device_count()) : 0;
    const torch::Device dev =
        (spec.device == "cuda" || (spec.device == "auto" && cuda))
            ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(
                                              dist.distributed() ? dist.localRank % std::max(1, gpus) : 0))
            : torch::Device(torch::kCPU);
    if (spec.precision == "fp16" && !dev.is_cuda())
        throw ConfigError(
            "`precision` fp16 needs a CUDA GPU and none is available here; use precision = \"bf16\" "
            "(--precision bf16), which runs on the CPU");
    return dev;
}

c10::optional<c10::ScalarType> autocastType(const RunSpec& spec) {
    if (spec.precision == "bf16") return c10::ScalarType::BFloat16;
    if (spec.precision == "fp16") return c10::ScalarType::Half;
    return c10::nullopt;
}

double gradNorm(const std::vector<torch::Tensor>& params) {
    torch::NoGradGuard noGrad;
    std::vector<torch::Tensor> norms;
    for (const auto& p : params)
        if (p.grad().defined()) norms.push_back(p.grad().norm(2).to(torch::kDouble));
    if (norms.empty()) return 0.0;
    return torch::stack(norms).norm(2).item<double>();
}

struct EvalResult {
    double loss = 0, accuracy = 0;
};

EvalResult evaluate(torch::nn::Sequential& model, const Tensors& data, c10::optional<c10::ScalarType> cast,
                    torch::Device device) {
    torch::NoGradGuard noGrad;
    std::optional<AutocastGuard> autocast;
    if (cast) autocast.emplace(device.type(), *cast);
    model->eval();
    double lossSum = 0;
    int64_t correct = 0;
    const int64_t n = data.size();
    for (int64_t i = 0; i < n; i += 1024) {
        const int64_t end = std::min(n, i + 1024);
        auto xb = data.x.slice(0, i, end);
        auto yb = data.y.slice(0, i, end);
        auto out = model->forward(xb).to(torch::kFloat);
        lossSum += classificationLoss(out, yb, torch::kSum).item<double>();
        correct += out.argmax(1).eq(yb).sum().item<int64_t>();
    }
    model->train();
    return {lossSum / static_cast<double>(n), static_cast<double>(correct) / static_cast<double>(n)};
}

std::string fmt(double v, int prec = 4) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    return buf;
}

}  // namespace

namespace {

// The collective engine for `ranksOnHost` ranks training on `device`: NCCL wants a CUDA LibTorch
// with NCCL and a GPU of its own per rank; Gloo takes anything (CUDA gradients through the CPU).
// `auto` picks NCCL where it can run; an explicit `nccl` that cannot is refused.
std::string resolveBackend(const RunSpec& spec, torch::Device device, int ranksOnHost) {
    const int gpus = device.is_cuda() ? cudaDeviceCount() : 0;
    if (spec.backend == "auto")
        return device.is_cuda() && DistContext::ncclBuilt() && ranksOnHost <= gpus ? "nccl" : "gloo";
    if (spec.backend != "nccl") return spec.backend;
    if (!DistContext::ncclBuilt())
        throw ConfigError("`backend` nccl: this LibTorch was built without NCCL; use backend = \"gloo\"");
    if (!device.is_cuda())
        throw ConfigError(
            "`backend` nccl exchanges CUDA tensors: train with device = \"cuda\", or use "
            "backend = \"gloo\"");
    if (ranksOnHost > gpus)
        throw ConfigError("`backend` nccl needs a GPU per rank: " + std::to_string(ranksOnHost) +
                          " ranks on this host, " + std::to_string(gpus) + " GPU(s); use backend = \"gloo\"");
    return "nccl";
}

}  // namespace

void torch_impl::checkRunnable(const RunSpec& spec) {
    validateOrThrow(spec);
    const auto device = resolveDevice(spec);
    if (spec.nproc > 1)
        resolveBackend(spec, device, static_cast<int>(spec.nproc));  // refused before workers start
}

TrainResult torch_impl::train(const RunSpec& spec, const TrainOptions& options, const EventSink& sink) {
    validateOrThrow(spec);
    auto emit = [&](Event e) {
        if (sink) sink(e);
    };
    auto metric = [&](const std::string& key, int64_t step, double value,
                      std::map<std::string, double>& last) {
        emit(Event::metric(key, step, value));
        last[key] = value;
    };

    if (spec.threads > 0) setComputeThreads(static_cast<int>(spec.threads));
    torch::manual_seed(static_cast<uint64_t>(spec.seed));
    const torch::Device device = resolveDevice(spec, options.dist);
    const auto cast = autocastType(spec);

    auto split = data::loadSplit(spec);
    const auto sampleShape = split.train.shape;
    const auto numClasses = static_cast<int64_t>(split.train.classNames.size());
    Tensors trainSet = toTensors(split.train);
    Tensors valSet = toTensors(split.val);
    split = {};
    trainSet = {trainSet.x.to(device), trainSet.y.to(device)};
    valSet = {valSet.x.to(device), valSet.y.to(device)};

    // Sparse embedding gradients only pay off where the ps exchange sends touched rows alone.
    auto model =
        makeModel(spec, sampleShape, numClasses, options.dist.distributed() && spec.strategy == "ps");
    model->to(device);  // parameters stay FP32: autocast casts per op (FP32 master weights)
    auto optimizer = makeOptimizer(spec, model->parameters());
    LossScaler scaler(spec, device);
    const auto params = model->parameters();

    TrainResult result;
    int64_t startEpoch = 0;
    int64_t step = 0;
    CheckpointExtras resumedExtras;  // the checkpoint's named tensors, for the reducer too
    if (!options.resumeFrom.empty()) {
        CheckpointExtras extras = scaler.state();
        const auto info =
            loadCheckpoint(options.resumeFrom, *model, *optimizer, &extras,
                           Reducer::residualPrefix(options.dist.distributed() ? options.dist.rank : 0));
        scaler.restore(extras);
        resumedExtras = std::move(extras);
        startEpoch = info.epoch;
        step = info.step;
        emit(Event::log("info", "resumed from " + info.path + " at epoch " + std::to_string(info.epoch) +
                                    ", step " + std::to_string(info.step)));
    }

    // Data parallel: every rank starts from rank 0's parameters and trains on its own shard.
    std::unique_ptr<DistContext> dist;
    std::unique_ptr<Reducer> reducer;
    const DistEnv& denv = options.dist;
    const int world = denv.distributed() ? denv.worldSize : 1;
    const int rank = denv.distributed() ? denv.rank : 0;
    if (denv.distributed()) {
        emit(Event::log("info", "rank " + std::to_string(rank) + " of " + std::to_string(world) +
                                    ": rendezvous at " + denv.masterAddr + ":" +
                                    std::to_string(denv.masterPort)));
        const std::string backend = resolveBackend(spec, device, denv.localWorldSize);
        emit(Event::log("info", "collectives: " + backend + (device.is_cuda() ? " on " + device.str() : "")));
        dist = std::make_unique<DistContext>(denv, backend,
                                             backend == "nccl" ? device : torch::Device(torch::kCPU));
        auto p = model->parameters();
        for (auto& b : model->buffers()) p.push_back(b);
        {
            torch::NoGradGuard noGrad;
            dist->broadcast(p, 0);
        }
        CompressOptions compress;
        compress.strategy = spec.strategy;
        compress.psRanks = static_cast<int>(spec.psRanks);
        if (spec.strategy == "hierarchical")
            dist->initHierarchy(
                static_cast<int>(spec.ranksPerHost > 0 ? spec.ranksPerHost : denv.localWorldSize));
        compress.format = spec.compress;
        compress.errorFeedback =
            spec.errorFeedback == "on" ||
            (spec.errorFeedback == "auto" && (spec.compress == "int8" || spec.compress == "int4"));
        compress.chunk = spec.compressChunk;
        compress.stochastic = spec.stochasticRounding;
        compress.seed = static_cast<uint64_t>(spec.seed);
        reducer =
            std::make_unique<Reducer>(*dist, params, spec.bucketMb, compress, sparseParameterIndices(model));
        if (compress.errorFeedback && !options.resumeFrom.empty()) {
            const auto prefix = Reducer::residualPrefix(rank);
            const bool has = std::any_of(resumedExtras.begin(), resumedExtras.end(),
                                         [&](const auto& kv) { return kv.first.rfind(prefix, 0) == 0; });
            if (has)
                reducer->restoreResiduals(resumedExtras);
            else
                emit(Event::log("warn",
                                "the checkpoint has no error-feedback residuals (written by an older Lathe): "
                                "they start again from zero"));
        }
        emit(Event::log("info",
                        "gradient exchange: " + spec.strategy +
                            (spec.strategy == "hierarchical"
                                 ? " (" + std::to_string(dist->ranksPerHost()) + " ranks per host)"
                             : spec.strategy == "ps" ? " (" + std::to_string(spec.psRanks) + " server ranks)"
                                                     : "")));
        if (spec.compress != "none")
            emit(Event::log("info", "gradients on the wire: " + spec.compress +
                                        (compress.errorFeedback ? " with" : " without") + " error feedback"));
    }

    const int64_t nTrain = trainSet.size();
    // Like DistributedSampler: the epoch's order padded to a multiple of the world size, and
    // rank r takes every world-th index from r, so the ranks' batches together form the batch
    // a single process would take with batch * world.
    const int64_t perRank = (nTrain + world - 1) / world;
    const int64_t stepsPerEpoch = (perRank + spec.batch - 1) / spec.batch;
    const int64_t totalSteps = stepsPerEpoch * spec.epochs;
    {
        Event running = Event::status(RunStatus::Running);
        running.step = step;
        running.value = static_cast<double>(totalSteps);
        emit(running);
    }
    emit(Event::log("info", spec.model + " (" + std::to_string(parameterCount(*model)) + " parameters) on " +
                                spec.data + ": " + std::to_string(nTrain) + " training / " +
                                std::to_string(valSet.size()) + " validation samples, " +
                                std::to_string(numClasses) + " classes, " + std::to_string(stepsPerEpoch) +
                                " steps per epoch; " + device.str() + ", " + spec.precision +
                                (scaler.enabled() ? ", loss scale " + fmt(scaler.scale(), 8) + " (" +
                                                        scaler.implementation() + ")"
                                                  : std::string()) +
                                (spec.activationCheckpointing ? ", activation checkpointing" : "")));
    if (startEpoch >= spec.epochs) {
        result.status = RunStatus::Completed;
        result.epochsDone = startEpoch;
        result.steps = step;
        emit(Event::log("info", "checkpoint already covers all " + std::to_string(spec.epochs) + " epochs"));
        emit(Event::status(RunStatus::Completed));
        return result;
    }

    auto saveCkpt = [&](int64_t epochsDone) {
        if (options.checkpointDir.empty()) return;
        auto extras = scaler.state();
        // Every rank takes part (a collective); rank 0 keeps them all in its checkpoint, so a
        // resumed compressed run carries the error the uninterrupted one would.
        if (reducer)
            for (auto& [name, t] : reducer->gatherResiduals()) extras[name] = std::move(t);
        if (rank != 0) return;
        const auto info = saveCheckpoint(options.checkpointDir + "/last.ckpt", *model, *optimizer, epochsDone,
                                         step, extras, options.owner);
        emit(Event::checkpoint(info.path, info.sha256, step, epochsDone));
    };

    std::unique_ptr<Profiler> profiler;
    if (spec.profile) {
        profiler = std::make_unique<Profiler>(
            ProfileSchedule{spec.profileWait, spec.profileWarmup, spec.profileActive, spec.profileRepeat});
        if (device.is_cuda()) {
            profiler->setDeviceSync([idx = device.index()] { torch::cuda::synchronize(idx); });
            // Per-op device time needs Lathe's CUDA runtime (kernels/); a build without it skips it.
            if (kernels::cuda::deviceCount() > 0) profiler->setDeviceOps(device.index());
        }
    }
    const std::set<int64_t> injectAt(spec.injectNonfinite.begin(), spec.injectNonfinite.end());
    ForwardOptions fwd;
    fwd.checkpoint = spec.activationCheckpointing;
    fwd.autocast = cast;
    fwd.device = device.type();

    std::map<std::string, double>& last = result.finalMetrics;
    model->train();
    bool stopped = false;
    int64_t epochsDone = startEpoch;
    int64_t consecutiveSkips = 0;
    constexpr int64_t kMaxStaticSkips = 100;
    for (int64_t epoch = startEpoch; epoch < spec.epochs && !stopped; ++epoch) {
        // The order depends only on (seed, epoch), so a resumed run sees the same batches.
        std::vector<int64_t> order(static_cast<size_t>(nTrain));
        std::iota(order.begin(), order.end(), 0);
        std::mt19937_64 rng(static_cast<uint64_t>(spec.seed) * 1000003ull + static_cast<uint64_t>(epoch));
        std::shuffle(order.begin(), order.end(), rng);
        if (world > 1) {
            std::vector<int64_t> shard;
            shard.reserve(static_cast<size_t>(perRank));
            for (int64_t i = rank; i < perRank * world; i += world)
                shard.push_back(order[static_cast<size_t>(i % nTrain)]);
            order.swap(shard);
        }
        const auto nLocal = static_cast<int64_t>(order.size());
        auto perm = torch::from_blob(order.data(), {nLocal}, torch::kInt64).to(device);

        double windowLoss = 0;
        int64_t windowSteps = 0, correct = 0, seen = 0, epochSteps = 0, skipped = 0;
        double stepSeconds = 0;
        size_t activationBytes = 0;
        for (int64_t b = 0; b < stepsPerEpoch; ++b) {
            bool stopNow = options.stop && options.stop->load(std::memory_order_relaxed);
            if (dist) stopNow = dist->any(stopNow);  // all ranks stop at the same step
            if (stopNow) {
                stopped = true;
                break;
            }
            const int64_t thisStep = step + 1;  // 1-based, as recorded
            if (profiler) profiler->beginStep(thisStep);
            // Activation memory is sampled on the first step of each epoch: the heap's growth
            // from the step's start to its peak (after forward, or inside recomputed segments).
            const bool sampleMemory = b == 0 && !device.is_cuda();
            size_t heapStart = 0, heapPeak = 0;
            HeapPeakScope heapScope(sampleMemory ? &heapPeak : nullptr);
            const auto t0 = Clock::now();
            const double lr = learningRate(spec, step, epoch, totalSteps);
            for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
            torch::Tensor xb, yb, out, loss;
            {
                PhaseScope phase(profiler.get(), "data");
                auto idx = perm.slice(0, b * spec.batch, std::min(nLocal, (b + 1) * spec.batch));
                xb = trainSet.x.index_select(0, idx);
                yb = trainSet.y.index_select(0, idx);
            }
            optimizer->zero_grad();
            if (sampleMemory)
                heapStart = heapPeak = heapInUse();  // after zero_grad, which may free gradients
            {
                PhaseScope phase(profiler.get(), "forward");
                {
                    std::optional<AutocastGuard> autocast;
                    if (cast) autocast.emplace(device.type(), *cast);
                    out = forwardModel(model, xb, fwd);
                }
                // The loss in FP32, outside autocast, as torch.autocast recommends.
                loss = classificationLoss(out.to(torch::kFloat), yb);
            }
            if (sampleMemory) sampleHeapPeak();
            Reducer::Stats comm;
            {
                PhaseScope phase(profiler.get(), "backward");
                if (reducer) reducer->prepare(thisStep);
                scaler.scaleLoss(loss).backward();
            }
            if (reducer) {
                PhaseScope phase(profiler.get(), "communication");
                comm = reducer->finish();
            }
            if (sampleMemory) {
                sampleHeapPeak();
                heapScope.release();
                activationBytes = heapPeak - std::min(heapPeak, heapStart);
            }
            if (injectAt.count(thisStep)) {
                // Fault injection: an inf in one gradient, as an fp16 overflow would leave.
                torch::NoGradGuard noGrad;
                for (const auto& p : params)
                    if (p.grad().defined()) {
                        p.grad().view(-1)[0] = std::numeric_limits<float>::infinity();
                        break;
                    }
            }
            const double lossValue = loss.item<double>();
            bool skip = false, lossBad = false;
            double norm = 0;
            const double usedScale = scaler.scale();
            {
                PhaseScope phase(profiler.get(), "optimizer");
                // Unscale once, before clipping, so the norm and the clip see true gradients.
                // Every rank must take the same decision: the gradients are the same averaged
                // ones, but each rank's loss is its own.
                lossBad = !std::isfinite(lossValue);
                if (dist) lossBad = dist->any(lossBad);
                bool foundInf = scaler.unscaleAndCheck(params) || (scaler.enabled() && lossBad);
                if (dist && scaler.enabled()) foundInf = dist->any(foundInf);
                norm = gradNorm(params);
                skip = scaler.enabled() && foundInf;
                if (!skip) {
                    if (spec.clipGradNorm > 0 && std::isfinite(norm) && norm > spec.clipGradNorm) {
                        torch::NoGradGuard noGrad;
                        const double coef = spec.clipGradNorm / (norm + 1e-6);
                        for (const auto& p : params)
                            if (p.grad().defined()) p.grad().mul_(coef);
                    }
                    optimizer->step();
                }
                scaler.update(foundInf);
                // Residuals of compressed exchanges hold scaled gradients: they follow the scale.
                if (reducer && scaler.enabled() && scaler.scale() != usedScale)
                    reducer->rescaleResiduals(scaler.scale() / usedScale);
            }
            correct += out.detach().argmax(1).eq(yb).sum().item<int64_t>();
            stepSeconds += std::chrono::duration<double>(Clock::now() - t0).count();
            seen += xb.size(0);
            ++step;
            ++epochSteps;
            if (profiler)
                for (auto& span : profiler->takeSpans()) emit(Event::profileSpan(std::move(span)));
            metric("train/grad_norm", step, norm, last);
            if (reducer) {
                metric("comm/bytes_sent", step, static_cast<double>(comm.bytesSent), last);
                metric("comm/ms", step, comm.commMs, last);
                metric("comm/overlap", step,
                       comm.commMs > 0 ? std::clamp(1.0 - comm.exposedMs / comm.commMs, 0.0, 1.0) : 0.0,
                       last);
                metric("comm/compression_ratio", step, comm.compressionRatio, last);
            }
            if (scaler.enabled()) {
                metric("amp/loss_scale", step, usedScale, last);
                metric("amp/skipped", step, skip ? 1.0 : 0.0, last);
            }
            auto flushWindow = [&] {
                if (step % spec.logEvery != 0 && b + 1 != stepsPerEpoch) return;
                double sum = windowLoss, count = static_cast<double>(windowSteps);
                if (dist) {  // the mean over every rank's steps (all ranks flush at the same steps)
                    auto t = torch::tensor({sum, count}, torch::kDouble);
                    dist->allreduceSum(t);
                    sum = t[0].item<double>();
                    count = t[1].item<double>();
                }
                if (count > 0) metric("train/loss", step, sum / count, last);
                windowLoss = 0;
                windowSteps = 0;
            };
            consecutiveSkips = skip ? consecutiveSkips + 1 : 0;
            if (skip && scaler.isStatic() && consecutiveSkips >= kMaxStaticSkips) {
                result.status = RunStatus::Failed;
                result.error = std::to_string(consecutiveSkips) +
                               " steps in a row had non-finite gradients at the static "
                               "loss scale " +
                               fmt(scaler.scale()) +
                               "; lower it (loss_scale = \"static:N\") or use "
                               "loss_scale = \"dynamic\"";
                emit(Event::error(result.error));
                emit(Event::status(RunStatus::Failed));
                result.epochsDone = epochsDone;
                result.steps = step;
                return result;
            }
            if (skip) {
                ++skipped;
                flushWindow();  // a skipped step adds no loss, but the epoch's last window still goes out
                if (scaler.scale() < 1e-30) {
                    result.status = RunStatus::Failed;
                    result.error =
                        "the loss scale collapsed below 1e-30 after " + std::to_string(skipped) +
                        " skipped steps: gradients are non-finite at any scale; lower `lr` or use fp32";
                    emit(Event::error(result.error));
                    emit(Event::status(RunStatus::Failed));
                    result.epochsDone = epochsDone;
                    result.steps = step;
                    return result;
                }
                continue;  // a skipped step contributes no loss to the window
            }
            if (lossBad) {
                metric("train/loss", step, lossValue, last);
                result.status = RunStatus::Failed;
                result.error = "loss became " + fmt(lossValue) + " at step " + std::to_string(step) +
                               " (epoch " + std::to_string(epoch + 1) + "); lower `lr` (now " + fmt(lr) +
                               ") or set `clip_grad_norm`";
                emit(Event::error(result.error));
                emit(Event::status(RunStatus::Failed));
                result.epochsDone = epochsDone;
                result.steps = step;
                return result;
            }
            windowLoss += lossValue;
            ++windowSteps;
            flushWindow();
        }
        if (profiler) profiler->beginStep(0);  // detach during validation
        if (epochSteps == 0) break;            // stopped before this epoch did anything
        if (dist) {
            auto t = torch::tensor({static_cast<double>(correct), static_cast<double>(seen)}, torch::kDouble);
            dist->allreduceSum(t);
            correct = static_cast<int64_t>(t[0].item<double>());
            seen = static_cast<int64_t>(t[1].item<double>());
        }
        metric("train/accuracy", step, static_cast<double>(correct) / static_cast<double>(seen), last);
        if (rank == 0 && !stopped) {  // the ranks hold identical models: one validation pass is enough
            const auto val = evaluate(model, valSet, cast, device);
            metric("val/loss", step, val.loss, last);
            metric("val/accuracy", step, val.accuracy, last);
        }
        metric("train/lr", step, learningRate(spec, step - 1, epoch, totalSteps), last);
        metric("perf/step_ms", step, 1000.0 * stepSeconds / static_cast<double>(epochSteps), last);
        metric("perf/samples_per_s", step, static_cast<double>(seen) / std::max(stepSeconds, 1e-9), last);
        if (activationBytes > 0)
            metric("perf/activation_mb", step, static_cast<double>(activationBytes) / 1e6, last);
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
    result.status = stopped ? RunStatus::Stopped : RunStatus::Completed;
    emit(Event::log("info", std::string("training ") + toString(result.status) + " after " +
                                std::to_string(step) + " steps"));
    emit(Event::status(result.status));
    return result;
}

}  // namespace lathe::core
