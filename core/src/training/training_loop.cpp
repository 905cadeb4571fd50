// The training loop's phases (training_loop.h).
#include "training/training_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>

#include "data/raw.h"
#include "distributed/pipeline.h"
#include "distributed/process_group.h"
#include "distributed/reducer.h"
#include "distributed/tensor_parallel.h"
#include "lathe/core/error.h"
#include "lathe/kernels/cuda_device.h"
#include "torch_backend.h"
#include "training/amp.h"
#include "training/checkpoint_file.h"
#include "training/checkpoint_io.h"
#include "training/fused_optim.h"
#include "training/loss_scaler.h"
#include "training/memory.h"
#include "training/mlp_step.h"
#include "training/profiler.h"
#include "training/zoo.h"

namespace lathe::core {

const char* toString(TrainingPhase phase) {
    switch (phase) {
        case TrainingPhase::SetUp:
            return "set-up";
        case TrainingPhase::Resume:
            return "resume";
        case TrainingPhase::Broadcast:
            return "broadcast";
        case TrainingPhase::Epoch:
            return "epoch";
        case TrainingPhase::Evaluation:
            return "evaluation";
        case TrainingPhase::Checkpoint:
            return "checkpoint";
    }
    return "?";
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

// LATHE_UNFUSED_STEP=1: LibTorch's optimizers and the tensor-by-tensor gradient norm, as before
// the fused step (for A/B measurements and debugging; read once).
bool unfusedStep() {
    static const bool unfused = [] {
        const char* v = std::getenv("LATHE_UNFUSED_STEP");
        return v && *v && std::string(v) != "0";
    }();
    return unfused;
}

// LATHE_AUTOGRAD_STEP=1: plain MLPs take autograd's forward and backward too, not MlpStep's
// (for A/B measurements and debugging).
bool mlpStepOff() {
    const char* v = std::getenv("LATHE_AUTOGRAD_STEP");  // read by each run (tests compare both)
    return v && *v && std::string(v) != "0";
}

// The fused classes are LibTorch's optimizers with the step on Lathe's kernels (fused_optim.h):
// the same options and checkpoint state, the same results.
template <class Fused, class Plain, class Options>
std::unique_ptr<torch::optim::Optimizer> makeOne(const std::vector<torch::Tensor>& params, const Options& o) {
    if (unfusedStep()) return std::make_unique<Plain>(params, o);
    return std::make_unique<Fused>(params, o);
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const RunSpec& spec,
                                                       const std::vector<torch::Tensor>& params) {
    if (spec.optimizer == "sgd")
        return makeOne<FusedSGD, torch::optim::SGD>(
            params, torch::optim::SGDOptions(spec.lr).momentum(spec.momentum).weight_decay(spec.weightDecay));
    if (spec.optimizer == "adam")
        return makeOne<FusedAdam, torch::optim::Adam>(
            params, torch::optim::AdamOptions(spec.lr).weight_decay(spec.weightDecay));
    if (spec.optimizer == "adamw")
        return makeOne<FusedAdamW, torch::optim::AdamW>(
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

c10::optional<c10::ScalarType> autocastType(const RunSpec& spec) {
    if (spec.precision == "bf16") return c10::ScalarType::BFloat16;
    if (spec.precision == "fp16") return c10::ScalarType::Half;
    return c10::nullopt;
}

// The squared L2 norm of the gradients of `params` whose `sharded` flag is `which` (all of them
// when `sharded` is empty and `which` is false).
double gradNormSquared(const std::vector<torch::Tensor>& params, const std::vector<bool>& sharded = {},
                       bool which = false) {
    torch::NoGradGuard noGrad;
    std::vector<torch::Tensor> norms;
    for (size_t i = 0; i < params.size(); ++i)
        if (params[i].grad().defined() && (i < sharded.size() ? sharded[i] : false) == which)
            norms.push_back(params[i].grad().norm(2).to(torch::kDouble));
    if (norms.empty()) return 0.0;
    const double n = torch::stack(norms).norm(2).item<double>();
    return n * n;
}

// How many rows of `logits` have their largest value at the label (argmax's first maximum, as
// out.argmax(1).eq(labels).sum() counts them): a plain loop over fp32 CPU logits, which spares
// a small model's step four ATen ops and their allocations; ATen's ops for anything else.
int64_t countCorrect(const torch::Tensor& logits, const torch::Tensor& labels) {
    torch::NoGradGuard noGrad;
    if (unfusedStep() || logits.dim() != 2 || !logits.device().is_cpu() ||
        logits.scalar_type() != torch::kFloat || !logits.is_contiguous() ||
        labels.scalar_type() != torch::kLong || !labels.is_contiguous() || !labels.device().is_cpu() ||
        labels.numel() != logits.size(0) || logits.size(1) == 0)
        return logits.detach().argmax(1).eq(labels).sum().item<int64_t>();
    const float* x = logits.data_ptr<float>();
    const int64_t* y = labels.data_ptr<int64_t>();
    const int64_t rows = logits.size(0), cols = logits.size(1);
    int64_t correct = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = x + r * cols;
        int64_t best = 0;
        for (int64_t c = 1; c < cols; ++c)
            // argmax treats NaN as the largest value (its first NaN wins).
            if (std::isnan(row[c]) ? !std::isnan(row[best]) : row[c] > row[best]) best = c;
        correct += best == y[r];
    }
    return correct;
}

struct EvalResult {
    double loss = 0, accuracy = 0;
    int64_t skipped = 0;  // unreadable samples skipped (bad_samples = "skip")
};

// A batch of the loader as tensors on `device` (through pinned memory on CUDA: see allocator()).
Batch toBatch(const data::LoadedBatch& loaded, const std::vector<int64_t>& sampleShape,
              torch::Device device) {
    const auto& owner =
        *std::static_pointer_cast<std::pair<torch::Tensor, torch::Tensor>>(loaded.buffer.owner);
    std::vector<int64_t> shape{loaded.rows};
    shape.insert(shape.end(), sampleShape.begin(), sampleShape.end());
    Batch b;
    // A full batch is the buffer itself (a view; no narrow); on the CPU nothing is copied.
    const bool full = loaded.rows == owner.first.size(0);
    auto x = (full ? owner.first : owner.first.narrow(0, 0, loaded.rows)).view(shape);
    auto y = full ? owner.second : owner.second.narrow(0, 0, loaded.rows);
    if (device.is_cpu()) {
        b.x = std::move(x);
        b.y = std::move(y);
        return b;
    }
    const bool async = device.is_cuda();
    b.x = x.to(device, async);
    b.y = y.to(device, async);
    return b;
}

EvalResult evaluate(torch::nn::Sequential& model, data::Loader& loader,
                    const std::vector<int64_t>& sampleShape, c10::optional<c10::ScalarType> cast,
                    torch::Device device) {
    torch::NoGradGuard noGrad;
    std::optional<AutocastGuard> autocast;
    if (cast) autocast.emplace(device.type(), *cast);
    model->eval();
    double lossSum = 0;
    int64_t correct = 0, n = 0, skipped = 0;
    std::vector<int64_t> order(static_cast<size_t>(loader.source().size()));
    std::iota(order.begin(), order.end(), 0);
    loader.start(std::move(order), 1024, data::SampleMode::Eval, 0, 0);
    data::LoadedBatch loaded;
    while (loader.next(loaded)) {
        const auto batch = toBatch(loaded, sampleShape, device);
        auto out = model->forward(batch.x).to(torch::kFloat);
        lossSum += classificationLoss(out, batch.y, torch::kSum).item<double>();
        correct += out.argmax(1).eq(batch.y).sum().item<int64_t>();
        n += loaded.rows;
        skipped += loaded.tally.skipped;
    }
    model->train();
    return {lossSum / static_cast<double>(std::max<int64_t>(n, 1)),
            static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(n, 1)), skipped};
}

std::string fmt(double v, int prec = 4) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    return buf;
}

constexpr int64_t kMaxStaticSkips = 100;  // a static loss scale that overflows this often is wrong
constexpr int kCheckpointTag = 1 << 20;   // a model-parallel stage's checkpoint on its way to rank 0

}  // namespace

struct TrainingLoop::EpochTally {
    double windowLoss = 0;  // the loss of the steps since train/loss was last recorded
    int64_t windowSteps = 0;
    int64_t correct = 0, seen = 0, steps = 0, skipped = 0;
    double stepSeconds = 0;
    // The step's phases without the profiler, on CPU runs (a CUDA step's phases would time only
    // kernel launches): data, forward, backward (with the exchange), optimizer.
    double phaseSeconds[4] = {0, 0, 0, 0};
    size_t activationBytes = 0;  // sampled on the epoch's first step (CPU)
    data::SampleTally data;      // the loader's cache lookups and hits this epoch
    int64_t dataSamples = 0;
    double dataBusySeconds = 0;
};

TrainingLoop::TrainingLoop(const RunSpec& spec, const TrainOptions& options, EventSink sink)
    : m_spec(spec), m_options(options), m_sink(std::move(sink)) {}

TrainingLoop::~TrainingLoop() = default;

void TrainingLoop::addHook(std::shared_ptr<TrainingHook> hook) { m_hooks.push_back(std::move(hook)); }

void TrainingLoop::emit(Event e) const {
    if (m_sink) m_sink(e);
}

void TrainingLoop::recordMetric(const std::string& key, double value) {
    emit(Event::metric(key, m_step, value));
    m_result.finalMetrics[key] = value;
}

torch::Tensor TrainingLoop::rawInput(const torch::Tensor& x) const {
    if (!m_inputMean.defined()) return x;
    return x * m_inputStd + m_inputMean;
}

void TrainingLoop::phaseDone(TrainingPhase phase) {
    for (auto& h : m_hooks) h->afterPhase(*this, phase);
}

TrainResult TrainingLoop::run() {
    validateOrThrow(m_spec);
    setUp();
    if (!m_options.resumeFrom.empty()) resume();
    if (m_options.dist.distributed()) broadcast();
    announce();
    if (m_startEpoch >= m_spec.epochs) {
        emit(
            Event::log("info", "checkpoint already covers all " + std::to_string(m_spec.epochs) + " epochs"));
        return finish(RunStatus::Completed);
    }
    m_model->train();
    for (int64_t e = m_startEpoch; e < m_spec.epochs && !m_stopped; ++e) {
        EpochTally tally;
        epoch(e, tally);
        if (!m_failure.empty()) return fail(m_failure);
        if (m_profiler) m_profiler->beginStep(0);  // detach during validation
        if (tally.steps == 0) break;               // stopped before this epoch did anything
        phaseDone(TrainingPhase::Epoch);
        try {
            evaluation(e, tally);
        } catch (const DataError& err) {
            return fail(err.what());  // an unreadable validation image (bad_samples = "error")
        }
        if (!m_stopped) {
            m_epochsDone = e + 1;
            const bool lastEpoch = e + 1 == m_spec.epochs;
            if (lastEpoch || (m_spec.checkpointEvery > 0 && (e + 1) % m_spec.checkpointEvery == 0))
                checkpoint(e + 1);
        }
    }
    const RunStatus status = m_stopped ? RunStatus::Stopped : RunStatus::Completed;
    emit(Event::log(
        "info", std::string("training ") + toString(status) + " after " + std::to_string(m_step) + " steps"));
    return finish(status);
}

TrainResult TrainingLoop::finish(RunStatus status) {
    m_result.status = status;
    m_result.epochsDone = m_epochsDone;
    m_result.steps = m_step;
    emit(Event::status(status));
    return m_result;
}

TrainResult TrainingLoop::fail(const std::string& error) {
    m_result.error = error;
    emit(Event::error(error));
    return finish(RunStatus::Failed);
}

// ---- set-up -------------------------------------------------------------------------------

void TrainingLoop::setUp() {
    if (m_spec.threads > 0) torch_impl::setComputeThreads(static_cast<int>(m_spec.threads));
    torch::manual_seed(static_cast<uint64_t>(m_spec.seed));
    m_device = resolveDevice(m_spec, m_options.dist);
    m_autocast = autocastType(m_spec);
    if (m_options.dist.distributed()) {
        m_rank = m_options.dist.rank;
        m_world = m_options.dist.worldSize;
    }
    m_stages = static_cast<int>(m_spec.pipelineStages);
    m_tp = static_cast<int>(m_spec.tensorParallel);
    const int split = m_stages * m_tp;
    if (split > 1 && (!m_options.dist.distributed() || m_world % split != 0))
        throw ConfigError("`pipeline_stages` x `tensor_parallel` = " + std::to_string(split) +
                          " needs a multiple of " + std::to_string(split) + " processes (this one has " +
                          std::to_string(m_world) +
                          "); start it with `lathectl train`, which launches one per stage and shard");
    // rank = (stage * replicas + replica) * tensor_parallel + shard: a tensor-parallel group is
    // consecutive ranks (one host, where its two all-reduces per layer pair are cheap), then a
    // stage's replicas, then the stages (Megatron-LM's order).
    m_replicas = m_world / split;
    m_tpRank = m_rank % m_tp;
    m_stage = (m_rank / m_tp) / m_replicas;
    m_replica = (m_rank / m_tp) % m_replicas;

    data::SourceOptions sourceOptions;
    sourceOptions.cacheDir = m_options.dataCacheDir;
    sourceOptions.dataVersion = m_options.dataVersion;
    sourceOptions.warn = [this](const std::string&, const std::string& message) {
        std::lock_guard lock(m_warnMu);
        m_warnings.push_back(message);
    };
    auto sources = data::openSources(m_spec, sourceOptions);
    m_trainSource = std::move(sources.train);
    m_valSource = std::move(sources.val);
    m_sampleShape = m_trainSource->shape();
    if (!sources.mean.empty()) {
        m_inputMean = torch::tensor(sources.mean).to(m_device);
        m_inputStd = torch::tensor(sources.stddev).to(m_device);
    }
    m_numClasses = static_cast<int64_t>(m_trainSource->classNames().size());
    // Batches are assembled by the loader's threads straight into tensors' memory: pinned on
    // CUDA, so that the copy to the GPU is asynchronous.
    const bool pinned = m_device.is_cuda();
    const data::BatchAllocator allocate = [pinned](int64_t rows, int64_t floats) {
        auto owner = std::make_shared<std::pair<torch::Tensor, torch::Tensor>>(
            torch::empty({rows, floats}, torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(pinned)),
            torch::empty({rows}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(pinned)));
        data::BatchBuffer b;
        b.x = owner->first.data_ptr<float>();
        b.y = owner->second.data_ptr<int64_t>();
        b.owner = std::move(owner);
        return b;
    };
    // In-memory samples are copied in the training thread: a digits batch takes a few
    // microseconds to copy and tens to hand over from another thread (tests/bench/README.md).
    const int workers = m_trainSource->inMemory() ? 0 : static_cast<int>(m_spec.loaderWorkers);
    const int prefetch = static_cast<int>(m_spec.prefetch);
    m_trainLoader = std::make_unique<data::Loader>(m_trainSource, workers, prefetch, allocate);
    m_valLoader = std::make_unique<data::Loader>(m_valSource, workers, prefetch, allocate);

    // Sparse embedding gradients only pay off where the ps exchange sends touched rows alone.
    m_model = makeModel(m_spec, m_sampleShape, m_numClasses,
                        m_options.dist.distributed() && m_spec.strategy == "ps");
    if (!m_spec.initFrom.empty()) {
        loadInitialWeights(m_model, m_spec.initFrom);
        emit(Event::log("info", "weights from " + m_spec.initFrom));
    }
    m_model->to(m_device);  // parameters stay FP32: autocast casts per op (FP32 master weights)
    m_networkParameters = parameterCount(*m_model);
    m_batch = m_spec.batch;
    if (split > 1) setUpModelParallel();
    m_params = m_model->parameters();
    for (const auto& p : m_params) m_sharded.push_back(m_tpGroup && isShardedParameter(m_model, p));
    for (auto& h : m_hooks) {
        for (auto& p : h->parameters(*this)) m_params.push_back(p);
        m_wantBlocks = m_wantBlocks || h->wantsBlocks();
    }
    m_optimizer = makeOptimizer(m_spec, m_params);
    m_scaler = std::make_unique<LossScaler>(m_spec, m_device);

    if (m_spec.profile) {
        m_profiler = std::make_unique<Profiler>(ProfileSchedule{m_spec.profileWait, m_spec.profileWarmup,
                                                                m_spec.profileActive, m_spec.profileRepeat});
        if (m_device.is_cuda()) {
            m_profiler->setDeviceSync([idx = m_device.index()] { torch::cuda::synchronize(idx); });
            // Per-op device time needs Lathe's CUDA runtime (kernels/); a build without it skips it.
            if (kernels::cuda::deviceCount() > 0) m_profiler->setDeviceOps(m_device.index());
        }
        // Pipeline stages after the first show on lanes of their own in the run's timeline
        // (replica 0's; the launcher keeps other ranks' spans only on such lanes).
        if (m_stages > 1 && m_replica == 0 && m_tpRank == 0)
            m_profiler->setLaneOffset(m_stage * kStageLaneStride);
    }

    // Like DistributedSampler: the epoch's order padded to a multiple of the replica count, and
    // replica r takes every replicas-th index from r, so the replicas' batches together form the
    // batch a single process would take with batch * replicas (a pipeline's stages all take
    // their replica's batches).
    const int64_t nTrain = m_trainSource->size();
    m_perRank = (nTrain + m_replicas - 1) / m_replicas;
    m_stepsPerEpoch = (m_perRank + m_batch - 1) / m_batch;
    m_totalSteps = m_stepsPerEpoch * m_spec.epochs;
    phaseDone(TrainingPhase::SetUp);
}

void TrainingLoop::resume() {
    CheckpointExtras extras = m_scaler->state();
    for (const auto& h : m_hooks) h->saveState(extras);  // the names to look for
    const auto info = loadCheckpoint(shardCheckpointPath(m_options.resumeFrom, m_stage, m_tpRank), *m_model,
                                     *m_optimizer, &extras, Reducer::residualPrefix(m_replica));
    if (m_pipe || m_tpGroup) {
        // Stage files are written together; a set of different steps (a crash between two
        // stages' writes) cannot be resumed as one network.
        auto t = torch::tensor({static_cast<double>(info.step), static_cast<double>(info.step * info.step)},
                               torch::kDouble);
        m_dist->allreduceSum(t);
        const double n = m_world, mean = t[0].item<double>() / n;
        if (std::abs(t[1].item<double>() / n - mean * mean) > 1e-6)
            throw CheckpointError("the pipeline stages' checkpoints beside " + m_options.resumeFrom +
                                  " are of different steps (this stage's: " + std::to_string(info.step) +
                                  "); they were not written together");
    }
    m_scaler->restore(extras);
    for (auto& h : m_hooks) h->restoreState(extras);
    m_resumedExtras = std::move(extras);
    m_startEpoch = m_epochsDone = info.epoch;
    m_step = info.step;
    emit(Event::log("info", "resumed from " + info.path + " at epoch " + std::to_string(info.epoch) +
                                ", step " + std::to_string(info.step)));
    phaseDone(TrainingPhase::Resume);
}

void TrainingLoop::connect() {
    if (m_dist) return;
    const DistEnv& denv = m_options.dist;
    emit(Event::log("info", "rank " + std::to_string(m_rank) + " of " + std::to_string(m_world) +
                                ": rendezvous at " + denv.masterAddr + ":" +
                                std::to_string(denv.masterPort)));
    const std::string backend = resolveBackend(m_spec, m_device, denv.localWorldSize);
    emit(Event::log("info", "collectives: " + backend + (m_device.is_cuda() ? " on " + m_device.str() : "")));
    m_dist = std::make_unique<DistContext>(denv, backend,
                                           backend == "nccl" ? m_device : torch::Device(torch::kCPU));
}

// Every rank builds the whole network from the same seed; rank 0 decides where the stages start
// (by parameters, by measured time, or as the checkpoint being resumed had them) and each rank
// keeps its stage's layers, split over the tensor-parallel group when there is one.
void TrainingLoop::setUpModelParallel() {
    connect();
    const int lws = m_options.dist.localWorldSize;
    if (m_tp > 1 && lws > 0 && lws % m_tp != 0)
        throw ConfigError("`tensor_parallel` " + std::to_string(m_tp) +
                          " keeps each group on one host, but a host runs " + std::to_string(lws) +
                          " ranks; give each host a multiple of " + std::to_string(m_tp) + " slots");
    if (m_stages == 1) {
        m_stageBounds = {0, static_cast<int64_t>(m_model->size())};
    } else {
        pipelineBounds();
    }
    const auto begin = m_stageBounds[static_cast<size_t>(m_stage)];
    const auto end = m_stageBounds[static_cast<size_t>(m_stage) + 1];
    std::vector<BoundaryShape> boundaries;
    if (m_stages > 1)
        boundaries = boundaryShapes(m_model, m_stageBounds, trainSamples(1), m_autocast, m_device.type());
    const std::string replica = std::to_string(m_replica), stage = std::to_string(m_stage),
                      shard = std::to_string(m_tpRank);
    std::string tpNote;
    if (m_tp > 1) {
        // The whole network's split (every stage's, as each stage plans its own layers): the
        // checkpoint keeps it for the export that merges the shards.
        m_tpPlan.assign(m_model->size(), TpSplit::None);
        for (int k = 0; k < m_stages; ++k) {
            const auto b = m_stageBounds[static_cast<size_t>(k)],
                       e = m_stageBounds[static_cast<size_t>(k) + 1];
            const auto part = planTensorParallel(m_model, b, e, m_tp);
            std::copy(part.begin() + b, part.begin() + e, m_tpPlan.begin() + b);
        }
        m_tpGroup = m_dist->subgroup("tp/" + stage + "/" + replica, m_tpRank, m_tp);
        m_model = tensorParallelModel(m_model, begin, end, m_tpPlan, *m_tpGroup);
        for (auto i = begin; i < end; ++i)
            if (m_tpPlan[static_cast<size_t>(i)] != TpSplit::None)
                tpNote += (tpNote.empty() ? "" : ", ") + std::to_string(i) + " " +
                          toString(m_tpPlan[static_cast<size_t>(i)]);
        emit(Event::log("info", "tensor parallel: shard " + shard + " of " + std::to_string(m_tp) +
                                    (m_stages > 1 ? " in stage " + stage : std::string()) +
                                    "; layers split: " + tpNote + "; " +
                                    std::to_string(parameterCount(*m_model)) + " parameters here"));
    } else {
        m_model = stageModel(m_model, begin, end);
    }
    if (m_replicas > 1)
        m_replicaGroup = m_dist->subgroup("replicas/" + stage + "/" + shard, m_replica, m_replicas);
    if (m_stages == 1) return;
    m_stageGroup = m_dist->subgroup("pipe/" + replica + "/" + shard, m_stage, m_stages);
    PipelineStage::Options o;
    o.schedule = m_spec.pipelineSchedule;
    o.microBatches = static_cast<int>(m_spec.microBatches);
    o.forward.checkpoint = m_spec.activationCheckpointing;
    o.forward.autocast = m_autocast;
    o.forward.device = m_device.type();
    o.device = m_device;
    m_pipe = std::make_unique<PipelineStage>(*m_stageGroup, m_model, std::move(boundaries), o);
    std::string layers;
    for (const auto& item : m_model->named_children()) layers += (layers.empty() ? "" : ",") + item.key();
    emit(Event::log(
        "info", "pipeline stage " + stage + " of " + std::to_string(m_stages) +
                    (m_replicas > 1 ? " (replica " + replica + " of " + std::to_string(m_replicas) + ")"
                                    : std::string()) +
                    ": layers " + layers + ", " + std::to_string(parameterCount(*m_model)) + " parameters; " +
                    std::to_string(m_spec.microBatches) + " micro-batches, " + m_spec.pipelineSchedule +
                    ", balanced by " + m_spec.balance));
}

void TrainingLoop::pipelineBounds() {
    const auto units = pipelineUnits(m_model);
    const int unitCount = static_cast<int>(units.size()) - 1;
    if (unitCount < m_stages)  // every rank refuses, so none waits for rank 0's bounds
        balanceStages(units, std::vector<double>(static_cast<size_t>(unitCount), 1.0), m_stages);
    const int64_t micro = std::max<int64_t>(1, m_batch / m_spec.microBatches);
    auto boundsT = torch::zeros({m_stages + 1}, torch::kLong);
    if (m_rank == 0) {
        StageBounds bounds;
        if (!m_options.resumeFrom.empty()) {
            torch::Tensor recorded;
            if (!readCheckpointExtra(m_options.resumeFrom, "pipe.bounds", recorded))
                throw CheckpointError("checkpoint " + m_options.resumeFrom +
                                      " was not written by a pipeline-parallel run (no stage bounds)");
            if (recorded.numel() != m_stages + 1)
                throw CheckpointError("checkpoint " + m_options.resumeFrom + " has " +
                                      std::to_string(recorded.numel() - 1) + " pipeline stages, this run " +
                                      std::to_string(m_stages));
            for (int64_t i = 0; i < recorded.numel(); ++i) bounds.push_back(recorded[i].item<int64_t>());
        } else if (m_spec.balance == "time") {
            bounds = balanceStages(units, unitTimeWeights(m_model, units, trainSamples(micro)), m_stages);
        } else {
            bounds = balanceStages(units, unitParameterWeights(m_model, units), m_stages);
        }
        for (int i = 0; i <= m_stages; ++i) boundsT[i] = bounds[static_cast<size_t>(i)];
    }
    {
        std::vector<torch::Tensor> one{boundsT};
        m_dist->broadcast(one, 0);
    }
    m_stageBounds.clear();
    for (int i = 0; i <= m_stages; ++i) m_stageBounds.push_back(boundsT[i].item<int64_t>());
}

// Data parallel: every rank starts from rank 0's parameters and trains on its own shard (a
// pipeline stage from its first replica's).
void TrainingLoop::broadcast() {
    connect();
    const bool modelParallel = m_stages > 1 || m_tp > 1;
    if (modelParallel && m_replicas == 1) {
        phaseDone(TrainingPhase::Broadcast);
        return;
    }
    DistContext& group = modelParallel ? *m_replicaGroup : *m_dist;
    auto p = m_params;  // the network's and the hooks'
    for (auto& b : m_model->buffers()) p.push_back(b);
    {
        torch::NoGradGuard noGrad;
        group.broadcast(p, 0);
    }
    CompressOptions compress;
    compress.strategy = m_spec.strategy;
    compress.psRanks = static_cast<int>(m_spec.psRanks);
    if (m_spec.strategy == "hierarchical")
        m_dist->initHierarchy(
            static_cast<int>(m_spec.ranksPerHost > 0 ? m_spec.ranksPerHost : m_options.dist.localWorldSize));
    compress.format = m_spec.compress;
    compress.errorFeedback =
        m_spec.errorFeedback == "on" ||
        (m_spec.errorFeedback == "auto" && (m_spec.compress == "int8" || m_spec.compress == "int4"));
    compress.chunk = m_spec.compressChunk;
    compress.stochastic = m_spec.stochasticRounding;
    compress.seed = static_cast<uint64_t>(m_spec.seed);
    // A pipeline's gradients accumulate over its micro-batches: they are exchanged once all are in.
    m_reducer = std::make_unique<Reducer>(group, m_params, m_spec.bucketMb, compress,
                                          sparseParameterIndices(m_model), /*overlap=*/m_stages == 1);
    if (compress.errorFeedback && !m_options.resumeFrom.empty()) {
        const auto prefix = Reducer::residualPrefix(m_replica);
        const bool has = std::any_of(m_resumedExtras.begin(), m_resumedExtras.end(),
                                     [&](const auto& kv) { return kv.first.rfind(prefix, 0) == 0; });
        if (has)
            m_reducer->restoreResiduals(m_resumedExtras);
        else
            emit(Event::log("warn",
                            "the checkpoint has no error-feedback residuals (written by an older Lathe): "
                            "they start again from zero"));
    }
    m_resumedExtras.clear();
    emit(Event::log("info", "gradient exchange: " + m_reducer->strategy()));
    if (m_spec.compress != "none")
        emit(Event::log("info", "gradients on the wire: " + m_spec.compress +
                                    (compress.errorFeedback ? " with" : " without") + " error feedback"));
    phaseDone(TrainingPhase::Broadcast);
}

void TrainingLoop::announce() {
    Event running = Event::status(RunStatus::Running);
    running.step = m_step;
    running.value = static_cast<double>(m_totalSteps);
    emit(running);
    emit(Event::log("info", m_spec.model + " (" + std::to_string(m_networkParameters) + " parameters) on " +
                                m_spec.data + ": " + std::to_string(m_trainSource->size()) + " training / " +
                                std::to_string(m_valSource->size()) + " validation samples, " +
                                std::to_string(m_numClasses) + " classes, " +
                                std::to_string(m_stepsPerEpoch) + " steps per epoch; " + m_device.str() +
                                ", " + m_spec.precision +
                                (m_scaler->enabled() ? ", loss scale " + fmt(m_scaler->scale(), 8) + " (" +
                                                           m_scaler->implementation() + ")"
                                                     : std::string()) +
                                (m_spec.activationCheckpointing ? ", activation checkpointing" : "")));
    emit(Event::log(
        "info", "data: " + m_trainSource->describe() + "; loader: " +
                    (m_trainLoader->workers() > 0
                         ? std::to_string(m_trainLoader->workers()) + " workers, " +
                               std::to_string(m_spec.prefetch) + " batches ahead"
                         : std::string("in the training thread") +
                               (m_spec.loaderWorkers > 0 && m_trainSource->inMemory() ? " (samples in memory)"
                                                                                      : "")) +
                    (m_device.is_cuda() ? ", pinned memory" : "")));
    drainWarnings();
}

// ---- epoch --------------------------------------------------------------------------------

std::vector<int64_t> TrainingLoop::epochOrder(int64_t epoch) const {
    const int64_t nTrain = m_trainSource->size();
    std::vector<int64_t> order(static_cast<size_t>(nTrain));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(static_cast<uint64_t>(m_spec.seed) * 1000003ull + static_cast<uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);
    if (m_replicas > 1) {
        std::vector<int64_t> shard;
        shard.reserve(static_cast<size_t>(m_perRank));
        for (int64_t i = m_replica; i < m_perRank * m_replicas; i += m_replicas)
            shard.push_back(order[static_cast<size_t>(i % nTrain)]);
        order.swap(shard);
    }
    return order;
}

double TrainingLoop::lastMetric(const std::string& key) const {
    const auto it = m_result.finalMetrics.find(key);
    return it == m_result.finalMetrics.end() ? std::numeric_limits<double>::quiet_NaN() : it->second;
}

void TrainingLoop::setBatchSize(int64_t batch) {
    if (batch < 1) throw Error("batch size must be at least 1 (got " + std::to_string(batch) + ")");
    if (m_world > 1) throw Error("the batch size cannot change during a data-parallel run");
    // The schedule's length follows: the epochs done so far at the old size, the rest at the new.
    // Called after an epoch's evaluation (before m_epochsDone counts it): train/epoch has it.
    const double recorded = lastMetric("train/epoch");
    const int64_t done = std::isnan(recorded) ? m_epochsDone : static_cast<int64_t>(recorded);
    const int64_t epochsLeft = std::max<int64_t>(0, m_spec.epochs - done);
    m_batch = batch;
    m_stepsPerEpoch = (m_perRank + m_batch - 1) / m_batch;
    m_totalSteps = m_step + m_stepsPerEpoch * epochsLeft;
}

void TrainingLoop::epoch(int64_t epoch, EpochTally& tally) {
    m_trainLoader->start(epochOrder(epoch), m_batch, data::SampleMode::Train,
                         static_cast<uint64_t>(m_spec.seed), epoch);
    for (int64_t b = 0; b < m_stepsPerEpoch; ++b) {
        StepEnd end;
        try {
            end = trainStep(epoch, b, tally);
        } catch (const DataError& e) {
            // An unreadable sample mid-run (bad_samples = "error"): the run fails naming the file.
            m_failure = e.what();
            return;
        }
        if (end == StepEnd::Stop || end == StepEnd::Fail) return;
    }
}

void TrainingLoop::drainWarnings() {
    std::vector<std::string> warnings;
    {
        std::lock_guard lock(m_warnMu);
        warnings.swap(m_warnings);
    }
    for (auto& w : warnings) emit(Event::log("warn", w));
}

Batch TrainingLoop::nextBatch(EpochTally& tally) {
    data::LoadedBatch loaded;
    double wait = 0;
    if (!m_trainLoader->next(loaded, &wait)) throw Error("the data loader ended its pass early");
    drainWarnings();
    tally.data.add(loaded.tally);
    tally.dataSamples += loaded.rows;
    tally.dataBusySeconds += loaded.busySeconds;
    // At the step this batch is for (recordMetric's m_step is still the previous one).
    const auto record = [&](const std::string& key, double value) {
        emit(Event::metric(key, m_step + 1, value));
        m_result.finalMetrics[key] = value;
    };
    record("data/wait_ms", 1000.0 * wait);
    // What the loader can deliver: samples per second of a worker's time, times the workers.
    const double workers = std::max(1, m_trainLoader->workers());
    if (tally.dataBusySeconds > 0)
        record("data/samples_per_s",
               workers * static_cast<double>(tally.dataSamples) / tally.dataBusySeconds);
    static const char* const kHitKeys[data::kCacheLevels] = {"data/hit_memory", "data/hit_disk",
                                                             "data/hit_redis"};
    for (int l = 0; l < data::kCacheLevels; ++l)
        if (tally.data.lookups[l] > 0)
            record(kHitKeys[l],
                   static_cast<double>(tally.data.hits[l]) / static_cast<double>(tally.data.lookups[l]));
    m_skippedSamples += loaded.tally.skipped;
    if (m_skippedSamples > 0) record("data/skipped", static_cast<double>(m_skippedSamples));
    return toBatch(loaded, m_sampleShape, m_device);
}

torch::Tensor TrainingLoop::trainSamples(int64_t n) const {
    n = std::min(n, m_trainSource->size());
    std::vector<float> x(static_cast<size_t>(n * m_trainSource->sampleFloats()));
    data::SampleTally tally;
    int64_t k = 0;
    for (int64_t i = 0; i < m_trainSource->size() && k < n; ++i)
        if (m_trainSource->read(i, data::SampleMode::Eval, 0, x.data() + k * m_trainSource->sampleFloats(),
                                tally))
            ++k;
    std::vector<int64_t> shape{k};
    shape.insert(shape.end(), m_sampleShape.begin(), m_sampleShape.end());
    return torch::from_blob(x.data(), shape, torch::kFloat32).clone().to(m_device);
}

// The mean loss over every rank's steps since the last window (all ranks flush at the same steps).
void TrainingLoop::flushLossWindow(EpochTally& tally, bool lastOfEpoch) {
    if (m_step % m_spec.logEvery != 0 && !lastOfEpoch) return;
    double sum = tally.windowLoss, count = static_cast<double>(tally.windowSteps);
    if (m_dist) {
        auto t = torch::tensor({sum, count}, torch::kDouble);
        m_dist->allreduceSum(t);
        sum = t[0].item<double>();
        count = t[1].item<double>();
    }
    if (count > 0) recordMetric("train/loss", sum / count);
    tally.windowLoss = 0;
    tally.windowSteps = 0;
}

TrainingLoop::StepEnd TrainingLoop::trainStep(int64_t epoch, int64_t b, EpochTally& tally) {
    bool stopNow = m_options.stop && m_options.stop->load(std::memory_order_relaxed);
    if (m_dist) stopNow = m_dist->any(stopNow);  // all ranks stop at the same step
    if (stopNow) {
        m_stopped = true;
        return StepEnd::Stop;
    }
    LossScaler& scaler = *m_scaler;
    Profiler* profiler = m_profiler.get();
    const int64_t thisStep = m_step + 1;  // 1-based, as recorded
    if (profiler) profiler->beginStep(thisStep);
    // Activation memory is sampled on the first step of each epoch: the peak of the CPU tensor
    // memory the step's forward and backward allocate (recomputed segments included).
    const bool sampleMemory = b == 0 && !m_device.is_cuda();
    std::optional<AllocationScope> memory;
    const auto t0 = Clock::now();
    const double lr = m_lrScale * learningRate(m_spec, m_step, epoch, m_totalSteps);
    for (auto& group : m_optimizer->param_groups()) group.options().set_lr(lr);
    Batch batch;
    torch::Tensor out, loss;
    {
        PhaseScope phase(profiler, "data");
        batch = nextBatch(tally);
    }
    const auto tData = Clock::now();
    // A plain MLP's forward and backward by hand (mlp_step.h), where nothing needs autograd's
    // graph: no autocast, checkpointing, hooks, exchange or model parallelism; not in a profiled
    // run (whose ops the profile shows) nor on the step that samples activation memory.
    if (!m_mlpChecked) {
        m_mlpChecked = true;
        if (m_device.is_cpu() && !m_autocast && !m_spec.activationCheckpointing && m_hooks.empty() &&
            !m_reducer && !m_pipe && !m_tpGroup && !m_wantBlocks && !unfusedStep() && !mlpStepOff())
            m_mlpStep = MlpStep::of(m_model);
        if (m_mlpStep)
            emit(Event::log("info",
                            "step: a plain MLP, forward and backward by hand without autograd's "
                            "graph (LATHE_AUTOGRAD_STEP=1 uses autograd)"));
    }
    const bool byHand = m_mlpStep && !sampleMemory && !profiler && m_mlpStep->accepts(batch.x, batch.y);
    const bool gradsToNone =
        !byHand && !m_reducer && !m_pipe && !m_tpGroup && !sampleMemory && !unfusedStep();
    if (gradsToNone) {
        // Backward then hands each parameter its gradient buffer as computed (AccumulateGrad
        // steals it) instead of adding it into a zeroed one: one pass and one op per tensor less.
        // (A parameter backward leaves without one gets zeros after it, below, as zero_grad()
        // would have left it: the optimizer steps it as before.)
        m_hadGrad.resize(m_params.size(), 0);
        for (size_t i = 0; i < m_params.size(); ++i) {
            auto& g = m_params[i].mutable_grad();
            m_hadGrad[i] = m_hadGrad[i] || g.defined();
            g.reset();
        }
    } else if (!byHand) {
        // The exchanges rely on defined, zeroed gradients; and a step that samples activation
        // memory must not count the gradients' allocation as activations.
        m_optimizer->zero_grad();
    }
    if (sampleMemory) memory.emplace();  // after zero_grad, which may free gradients
    Reducer::Stats comm;
    double lossValue = 0;
    int64_t correct = 0;
    PipelineStage::StepStats pipe;
    auto tForward = tData;  // a pipelined step's forward and backward interleave: all "backward"
    if (m_pipe) {
        // The stage's share of the schedule: its micro-batches' forward and backward passes, with
        // activations and gradients to and from its neighbours; the loss only on the last stage.
        if (m_reducer) m_reducer->prepare(thisStep);
        pipe = m_pipe->step(
            batch.x, batch.y, batch.x.size(0),
            [](const torch::Tensor& logits, const torch::Tensor& labels) {
                return classificationLoss(logits, labels);
            },
            [&scaler](const torch::Tensor& l) { return scaler.scaleLoss(l); }, profiler);
        if (m_reducer) {
            PhaseScope phase(profiler, "communication");
            comm = m_reducer->finish();
        }
        // Every stage learns the loss (the others add zeros): for the loss window and for a
        // non-finite loss that must stop every rank with the same message.
        auto l = torch::tensor({m_pipe->last() ? pipe.loss : 0.0}, torch::kDouble);
        m_stageGroup->allreduceSum(l);
        lossValue = l.item<double>();
        correct = pipe.correct;
    } else if (byHand) {
        auto r =
            m_mlpStep->run(batch.x, batch.y, scaler.enabled() ? static_cast<float>(scaler.scale()) : 1.0f);
        tForward = r.forwardDone;
        out = r.logits;
        lossValue = r.loss;
        correct = countCorrect(out, batch.y);
    } else {
        {
            PhaseScope phase(profiler, "forward");
            {
                std::optional<AutocastGuard> autocast;
                if (m_autocast) autocast.emplace(m_device.type(), *m_autocast);
                ForwardOptions fwd;
                fwd.checkpoint = m_spec.activationCheckpointing;
                fwd.autocast = m_autocast;
                fwd.device = m_device.type();
                if (m_wantBlocks)
                    out = forwardWithBlocks(m_model, batch.x, batch.blocks);
                else
                    out = forwardModel(m_model, batch.x, fwd);
            }
            // The loss in FP32, outside autocast, as torch.autocast recommends.
            loss =
                classificationLoss(out.scalar_type() == torch::kFloat ? out : out.to(torch::kFloat), batch.y);
            for (auto& h : m_hooks) loss = h->loss(*this, batch, out, loss);
        }
        tForward = Clock::now();
        {
            PhaseScope phase(profiler, "backward");
            if (m_reducer) m_reducer->prepare(thisStep);
            scaler.scaleLoss(loss).backward();
        }
        if (m_reducer) {
            PhaseScope phase(profiler, "communication");
            comm = m_reducer->finish();
        }
        if (gradsToNone)
            for (size_t i = 0; i < m_params.size(); ++i)
                if (m_hadGrad[i] && !m_params[i].grad().defined())
                    m_params[i].mutable_grad() = torch::zeros_like(m_params[i]);
        lossValue = loss.item<double>();
        correct = countCorrect(out, batch.y);
    }
    if (memory) {
        tally.activationBytes = memory->peakBytes();
        memory.reset();
    }
    if (std::find(m_spec.injectNonfinite.begin(), m_spec.injectNonfinite.end(), thisStep) !=
        m_spec.injectNonfinite.end()) {
        // Fault injection: an inf in one gradient, as an fp16 overflow would leave.
        torch::NoGradGuard noGrad;
        for (const auto& p : m_params)
            if (p.grad().defined()) {
                p.grad().view(-1)[0] = std::numeric_limits<float>::infinity();
                break;
            }
    }
    bool skip = false, lossBad = false;
    double norm = 0;
    const double usedScale = scaler.scale();
    const auto tBackward = Clock::now();
    {
        PhaseScope phase(profiler, "optimizer");
        // Unscale once, before clipping, so the norm and the clip see true gradients. Every rank
        // must take the same decision: the gradients are the same averaged ones, but each rank's
        // loss is its own.
        lossBad = !std::isfinite(lossValue);
        if (m_dist) lossBad = m_dist->any(lossBad);
        // One pass over each gradient (fp32 on the CPU): unscale, non-finite check and the
        // squared norm together; elsewhere the scaler's unscale and a norm per tensor.
        LossScaler::GradSummary grads;
        if (unfusedStep() || !scaler.gradientPass(m_params, m_sharded, grads)) {
            grads.nonFinite = scaler.unscaleAndCheck(m_params);
            grads.sumSquares = gradNormSquared(m_params, m_sharded, false);
            if (m_tpGroup) grads.shardedSumSquares = gradNormSquared(m_params, m_sharded, true);
        }
        bool foundInf = scaler.enabled() && (grads.nonFinite || lossBad);
        if (m_dist && scaler.enabled()) foundInf = m_dist->any(foundInf);
        // The whole network's norm: every shard's share of the split layers, the replicated
        // ones once, summed over the stages.
        double sq = grads.sumSquares;
        if (m_tpGroup) {
            auto t = torch::tensor({grads.shardedSumSquares}, torch::kDouble);
            m_tpGroup->allreduceSum(t);
            sq += t.item<double>();
        }
        if (m_stageGroup) {
            auto t = torch::tensor({sq}, torch::kDouble);
            m_stageGroup->allreduceSum(t);
            sq = t.item<double>();
        }
        norm = std::sqrt(sq);
        skip = scaler.enabled() && foundInf;
        if (!skip) {
            if (m_spec.clipGradNorm > 0 && std::isfinite(norm) && norm > m_spec.clipGradNorm) {
                const double coef = m_spec.clipGradNorm / (norm + 1e-6);
                if (auto* fused = dynamic_cast<FusedStep*>(m_optimizer.get())) {
                    fused->setGradScale(coef);  // applied in the step's own pass
                } else {
                    torch::NoGradGuard noGrad;
                    for (const auto& p : m_params)
                        if (p.grad().defined()) p.grad().mul_(coef);
                }
            }
            m_optimizer->step();
        }
        scaler.update(foundInf);
        // Residuals of compressed exchanges hold scaled gradients: they follow the scale.
        if (m_reducer && scaler.enabled() && scaler.scale() != usedScale)
            m_reducer->rescaleResiduals(scaler.scale() / usedScale);
    }
    if (!m_device.is_cuda()) {
        const auto tOptimizer = Clock::now();
        const auto sec = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
        tally.phaseSeconds[0] += sec(t0, tData);
        tally.phaseSeconds[1] += sec(tData, tForward);
        tally.phaseSeconds[2] += sec(tForward, tBackward);
        tally.phaseSeconds[3] += sec(tBackward, tOptimizer);
    }
    // Predictions are the last stage's: only it counts them (and the loss).
    // (and of a tensor-parallel group, whose ranks all compute them, only shard 0).
    const bool countsOutput = (!m_pipe || m_pipe->last()) && m_tpRank == 0;
    if (countsOutput) {
        tally.correct += correct;
        tally.seen += batch.x.size(0);
    }
    ++m_step;
    ++tally.steps;
    // The step's time includes handing its profile spans on: what the profiler costs a run.
    if (profiler)
        for (auto& span : profiler->takeSpans()) emit(Event::profileSpan(std::move(span)));
    tally.stepSeconds += std::chrono::duration<double>(Clock::now() - t0).count();
    recordMetric("train/grad_norm", norm);
    if (m_reducer) {
        recordMetric("comm/bytes_sent", static_cast<double>(comm.bytesSent));
        recordMetric("comm/ms", comm.commMs);
        recordMetric("comm/overlap",
                     comm.commMs > 0 ? std::clamp(1.0 - comm.exposedMs / comm.commMs, 0.0, 1.0) : 0.0);
        recordMetric("comm/compression_ratio", comm.compressionRatio);
    }
    if (m_pipe && m_replica == 0 && m_tpRank == 0) {
        const std::string stage = "pipe/stage" + std::to_string(m_stage) + "/";
        recordMetric(stage + "bubble", pipe.bubble);
        recordMetric(stage + "forward_ms", pipe.forwardMs);
        recordMetric(stage + "backward_ms", pipe.backwardMs);
        recordMetric(stage + "bytes_sent", static_cast<double>(pipe.bytesSent));
        recordMetric(stage + "in_flight", static_cast<double>(pipe.maxInFlight));
        if (b == 0 && tally.activationBytes > 0)
            recordMetric(stage + "activation_mb", static_cast<double>(tally.activationBytes) / 1e6);
        // The mean over stages on rank 0 (the run's summary figure).
        auto t = torch::tensor({pipe.bubble}, torch::kDouble);
        m_stageGroup->allreduceSum(t);
        if (m_rank == 0) recordMetric("pipe/bubble", t.item<double>() / m_stages);
        if (m_rank == 0) recordMetric("pipe/micro_batches", static_cast<double>(pipe.microBatches));
    }
    if (scaler.enabled()) {
        recordMetric("amp/loss_scale", usedScale);
        recordMetric("amp/skipped", skip ? 1.0 : 0.0);
    }
    if (!skip)
        for (auto& h : m_hooks) h->afterStep(*this, m_step);

    const bool lastOfEpoch = b + 1 == m_stepsPerEpoch;
    m_consecutiveSkips = skip ? m_consecutiveSkips + 1 : 0;
    if (skip && scaler.isStatic() && m_consecutiveSkips >= kMaxStaticSkips) {
        m_failure = std::to_string(m_consecutiveSkips) +
                    " steps in a row had non-finite gradients at the static loss scale " +
                    fmt(scaler.scale()) +
                    "; lower it (loss_scale = \"static:N\") or use loss_scale = \"dynamic\"";
        return StepEnd::Fail;
    }
    if (skip) {
        ++tally.skipped;
        flushLossWindow(tally, lastOfEpoch);  // a skipped step adds no loss, but the epoch's last
                                              // window still goes out
        if (scaler.scale() < 1e-30) {
            m_failure = "the loss scale collapsed below 1e-30 after " + std::to_string(tally.skipped) +
                        " skipped steps: gradients are non-finite at any scale; lower `lr` or use fp32";
            return StepEnd::Fail;
        }
        return StepEnd::Skipped;
    }
    if (lossBad) {
        recordMetric("train/loss", lossValue);
        m_failure = "loss became " + fmt(lossValue) + " at step " + std::to_string(m_step) + " (epoch " +
                    std::to_string(epoch + 1) + "); lower `lr` (now " + fmt(lr) + ") or set `clip_grad_norm`";
        return StepEnd::Fail;
    }
    tally.windowLoss += lossValue;
    ++tally.windowSteps;
    flushLossWindow(tally, lastOfEpoch);
    return StepEnd::Done;
}

// ---- evaluation and checkpoint --------------------------------------------------------------

void TrainingLoop::evaluation(int64_t epoch, EpochTally& tally) {
    int64_t correct = tally.correct, seen = tally.seen;
    if (m_dist) {
        auto t = torch::tensor({static_cast<double>(correct), static_cast<double>(seen)}, torch::kDouble);
        m_dist->allreduceSum(t);
        correct = static_cast<int64_t>(t[0].item<double>());
        seen = static_cast<int64_t>(t[1].item<double>());
    }
    recordMetric("train/accuracy", static_cast<double>(correct) / static_cast<double>(seen));
    const bool modelParallel = m_pipe || m_tpGroup;
    if (modelParallel && m_replica == 0 && !m_stopped) {
        // Every stage and shard of replica 0 takes part (their collectives are in the forward pass).
        ValResult val;
        if (m_pipe) {
            val = validatePipelined();
        } else {
            const auto e = evaluate(m_model, *m_valLoader, m_sampleShape, m_autocast, m_device);
            val = {e.loss, e.accuracy, e.skipped};
        }
        if (m_rank == 0) {
            if (val.skipped > 0) {
                m_skippedSamples += val.skipped;
                recordMetric("data/skipped", static_cast<double>(m_skippedSamples));
            }
            recordMetric("val/loss", val.loss);
            recordMetric("val/accuracy", val.accuracy);
        }
    } else if (!modelParallel && m_rank == 0 && !m_stopped) {
        // the ranks hold identical models: one validation pass is enough
        const auto val = evaluate(m_model, *m_valLoader, m_sampleShape, m_autocast, m_device);
        if (val.skipped > 0) {
            m_skippedSamples += val.skipped;
            recordMetric("data/skipped", static_cast<double>(m_skippedSamples));
        }
        recordMetric("val/loss", val.loss);
        recordMetric("val/accuracy", val.accuracy);
    }
    recordMetric("train/lr", m_lrScale * learningRate(m_spec, m_step - 1, epoch, m_totalSteps));
    recordMetric("perf/step_ms", 1000.0 * tally.stepSeconds / static_cast<double>(tally.steps));
    recordMetric("perf/samples_per_s", static_cast<double>(seen) / std::max(tally.stepSeconds, 1e-9));
    if (tally.activationBytes > 0)
        recordMetric("perf/activation_mb", static_cast<double>(tally.activationBytes) / 1e6);
    if (!m_device.is_cuda() && tally.steps > 0) {
        static const char* const kPhaseKeys[4] = {"perf/data_ms", "perf/forward_ms", "perf/backward_ms",
                                                  "perf/optimizer_ms"};
        for (int k = 0; k < 4; ++k)
            if (k != 1 || !m_pipe)
                recordMetric(kPhaseKeys[k],
                             1000.0 * tally.phaseSeconds[k] / static_cast<double>(tally.steps));
    }
    recordMetric("train/epoch", static_cast<double>(epoch + 1));
    phaseDone(TrainingPhase::Evaluation);
}

// Every stage of replica 0 reads the same validation batches (the first stage needs the inputs,
// the last the labels); the last stage's sums reach rank 0 through the stage group.
TrainingLoop::ValResult TrainingLoop::validatePipelined() {
    m_model->eval();
    double lossSum = 0;
    int64_t correct = 0, n = 0, skipped = 0;
    std::vector<int64_t> order(static_cast<size_t>(m_valSource->size()));
    std::iota(order.begin(), order.end(), 0);
    m_valLoader->start(std::move(order), 1024, data::SampleMode::Eval, 0, 0);
    data::LoadedBatch loaded;
    while (m_valLoader->next(loaded)) {
        const auto batch = toBatch(loaded, m_sampleShape, m_device);
        const auto out = m_pipe->forward(batch.x, loaded.rows);
        if (m_pipe->last()) {
            lossSum += classificationLoss(out, batch.y, torch::kSum).item<double>();
            correct += out.argmax(1).eq(batch.y).sum().item<int64_t>();
        }
        n += loaded.rows;
        skipped += loaded.tally.skipped;
    }
    m_model->train();
    auto t = torch::tensor({lossSum, static_cast<double>(correct)}, torch::kDouble);
    m_stageGroup->allreduceSum(t);
    ValResult r;
    const double rows = static_cast<double>(std::max<int64_t>(n, 1));
    r.loss = t[0].item<double>() / rows;
    r.accuracy = t[1].item<double>() / rows;
    r.skipped = skipped;
    return r;
}

void TrainingLoop::checkpoint(int64_t epochsDone) {
    if (m_options.checkpointDir.empty()) return;
    auto extras = m_scaler->state();
    for (const auto& h : m_hooks) h->saveState(extras);
    // Every rank takes part (a collective); rank 0 keeps them all in its checkpoint, so a resumed
    // compressed run carries the error the uninterrupted one would.
    if (m_reducer)
        for (auto& [name, t] : m_reducer->gatherResiduals()) extras[name] = std::move(t);
    const std::string path = m_options.checkpointDir + "/last.ckpt";
    if (m_pipe || m_tpGroup) {
        // One file per stage and shard (the first replica's), each with its layers under the
        // whole network's names; stage 0's first shard also holds the bounds and the split, so a
        // resume or an export finds the others. Rank 0 writes them all, so that they are together
        // where its checkpoints are fetched from on another host: the other stages' and shards'
        // first, its own last (the one the run records, once every file is written).
        if (m_replica == 0 && m_rank != 0) {
            m_dist->sendBytes(checkpointPayload(*m_model, *m_optimizer, extras), 0, kCheckpointTag);
        } else if (m_rank == 0) {
            for (int s = 0; s < m_stages; ++s)
                for (int t = 0; t < m_tp; ++t) {
                    if (s == 0 && t == 0) continue;
                    const int from = (s * m_replicas) * m_tp + t;  // replica 0 of stage s, shard t
                    writeCheckpointFile(shardCheckpointPath(path, s, t), epochsDone, m_step,
                                        m_dist->recvBytes(from, kCheckpointTag), m_options.owner);
                }
            extras["pipe.bounds"] =
                torch::tensor(std::vector<int64_t>(m_stageBounds.begin(), m_stageBounds.end()), torch::kLong);
            if (m_tpGroup) {
                std::vector<int64_t> plan;
                for (auto k : m_tpPlan) plan.push_back(static_cast<int64_t>(k));
                extras["tp.plan"] = torch::tensor(plan, torch::kLong);
            }
            const auto info =
                saveCheckpoint(path, *m_model, *m_optimizer, epochsDone, m_step, extras, m_options.owner);
            emit(Event::checkpoint(info.path, info.sha256, m_step, epochsDone));
        }
        m_dist->any(false);  // every rank waits for the files, as for rank 0's alone
    } else if (m_rank == 0) {
        const auto info =
            saveCheckpoint(path, *m_model, *m_optimizer, epochsDone, m_step, extras, m_options.owner);
        emit(Event::checkpoint(info.path, info.sha256, m_step, epochsDone));
    }
    phaseDone(TrainingPhase::Checkpoint);
}

}  // namespace lathe::core
