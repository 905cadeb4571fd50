#pragma once
// The training loop (private: LibTorch types). torch_impl::train() (trainer.cpp) builds one
// TrainingLoop per run and calls run(); everything a run does happens in one of its named
// phases, in this order:
//
//   setUp        device, the data's sources and loaders, network, optimizer, loss scaler
//   resume       (with --resume) model, optimizer, scaler state, position from a checkpoint
//   broadcast    (data parallel) rendezvous, rank 0's parameters to every rank, the reducer
//   epoch        the steps of one epoch: data (the loader's next batch), forward, backward,
//                communication, optimizer
//   evaluation   the epoch's metrics and (rank 0) one validation pass
//   checkpoint   (every `checkpoint_every` epochs and the last) the run's state to disk
//
// Capabilities that change how a run trains (quantization-aware training, distillation losses,
// pruning rounds, another data pipeline) plug in as TrainingHooks rather than growing the loop.
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/loader.h"
#include "lathe/core/events.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/trainer.h"

namespace lathe::core {

class DistContext;
class LossScaler;
class PipelineStage;
enum class TpSplit : int64_t;
class Profiler;
class MlpStep;
class Reducer;

enum class TrainingPhase { SetUp, Resume, Broadcast, Epoch, Evaluation, Checkpoint };
const char* toString(TrainingPhase phase);

/// One step's inputs; `blocks`: the network's block outputs (after each ReLU, or its max-pool),
/// filled during forward only when a hook asks for them (wantsBlocks).
struct Batch {
    torch::Tensor x, y;
    std::vector<torch::Tensor> blocks;
};

class TrainingLoop;

/// Extension point. Every function has a do-nothing default; hooks run in the order added.
class TrainingHook {
public:
    virtual ~TrainingHook() = default;
    /// After each phase has finished (Epoch and Evaluation once per epoch).
    virtual void afterPhase(TrainingLoop&, TrainingPhase) {}
    /// The step's loss from the batch and the network's output: `loss` is the classification
    /// loss (FP32, outside autocast) or the previous hook's result. Extra terms go here
    /// (distillation against a teacher, a sparsity penalty).
    virtual torch::Tensor loss(TrainingLoop&, const Batch&, const torch::Tensor& logits, torch::Tensor loss) {
        return loss;
    }
    /// After the optimizer's step (not called for a step the loss scaler skipped).
    virtual void afterStep(TrainingLoop&, int64_t step) {}
    /// Trainable tensors of the hook's own (a distillation hint's regressor), asked once when the
    /// network exists: they are optimized, exchanged, clipped and broadcast with the network's
    /// parameters, and saved in checkpoints through saveState/restoreState.
    virtual std::vector<torch::Tensor> parameters(TrainingLoop&) { return {}; }
    /// True: forward keeps the network's block outputs in Batch::blocks for loss().
    virtual bool wantsBlocks() const { return false; }
    /// Named tensors for the checkpoint (names must not collide with other hooks'); restoreState
    /// gets those the checkpoint had.
    virtual void saveState(std::map<std::string, torch::Tensor>&) const {}
    virtual void restoreState(const std::map<std::string, torch::Tensor>&) {}
};

class TrainingLoop {
public:
    TrainingLoop(const RunSpec& spec, const TrainOptions& options, EventSink sink);
    ~TrainingLoop();
    TrainingLoop(const TrainingLoop&) = delete;
    TrainingLoop& operator=(const TrainingLoop&) = delete;

    void addHook(std::shared_ptr<TrainingHook> hook);
    /// Runs every phase. Config, data and checkpoint errors throw before the first step;
    /// failures during training are returned (status Failed after an Error event).
    TrainResult run();

    // For hooks.
    const RunSpec& spec() const { return m_spec; }
    torch::nn::Sequential& model() { return m_model; }
    torch::optim::Optimizer& optimizer() { return *m_optimizer; }
    torch::Device device() const { return m_device; }
    int64_t step() const { return m_step; }  // steps taken (the last recorded step)
    int rank() const { return m_rank; }
    int worldSize() const { return m_world; }
    int64_t numClasses() const { return m_numClasses; }
    /// The first `n` training samples (as the network takes them).
    torch::Tensor trainSamples(int64_t n) const;
    /// The samples as the data set stores them: undoes the csv standardisation the network's
    /// inputs went through (a teacher artifact standardises raw input itself).
    torch::Tensor rawInput(const torch::Tensor& x) const;
    void emit(Event e) const;
    /// Records a metric at the current step (also kept as the run's final value).
    void recordMetric(const std::string& key, double value);
    /// The last value recorded for `key` (NaN when none yet).
    double lastMetric(const std::string& key) const;
    /// The batch size of the epochs to come (a tuning agent's decision; single process only):
    /// the steps per epoch follow it from the next epoch.
    int64_t batchSize() const { return m_batch; }
    void setBatchSize(int64_t batch);
    /// A factor on the schedule's learning rate from the next step on (1 = as the spec says).
    double lrScale() const { return m_lrScale; }
    void setLrScale(double scale) { m_lrScale = scale; }
    /// Training samples (this rank's share of an epoch).
    int64_t trainSamplesPerEpoch() const { return m_perRank; }

private:
    struct EpochTally;  // what one epoch's steps add up
    enum class StepEnd { Done, Skipped, Stop, Fail };

    void setUp();
    void resume();
    void broadcast();
    /// Rendezvous of every rank (once): the world's process group.
    void connect();
    /// Pipeline and tensor parallel: this rank's stage of the network (its shard of it), its
    /// pipeline, tensor-parallel and replica groups.
    void setUpModelParallel();
    /// The stage bounds: rank 0's (by parameters, by time, or the checkpoint's), broadcast.
    void pipelineBounds();
    void announce();
    void epoch(int64_t epoch, EpochTally& tally);
    StepEnd trainStep(int64_t epoch, int64_t b, EpochTally& tally);
    /// The loader's next batch on the device, and the data/ metrics of the wait for it.
    Batch nextBatch(EpochTally& tally);
    void drainWarnings();
    void evaluation(int64_t epoch, EpochTally& tally);
    /// Pipeline parallel: one validation pass through the stages of replica 0 (every one of its
    /// stages takes part; the result is the last stage's, summed into every stage).
    struct ValResult {
        double loss = 0, accuracy = 0;
        int64_t skipped = 0;
    };
    ValResult validatePipelined();
    void checkpoint(int64_t epochsDone);

    /// The epoch's sample order on this rank: depends only on (seed, epoch), so a resumed run
    /// sees the same batches; sharded like DistributedSampler.
    std::vector<int64_t> epochOrder(int64_t epoch) const;
    void flushLossWindow(EpochTally& tally, bool lastOfEpoch);
    void phaseDone(TrainingPhase phase);
    TrainResult finish(RunStatus status);
    TrainResult fail(const std::string& error);

    const RunSpec m_spec;
    const TrainOptions m_options;
    const EventSink m_sink;
    std::vector<std::shared_ptr<TrainingHook>> m_hooks;

    torch::Device m_device{torch::kCPU};
    c10::optional<c10::ScalarType> m_autocast;
    // Warnings from the loader's threads, emitted by the training thread (declared before the
    // loaders: their threads are joined before these go).
    std::mutex m_warnMu;
    std::vector<std::string> m_warnings;
    std::shared_ptr<data::SampleSource> m_trainSource, m_valSource;
    std::unique_ptr<data::Loader> m_trainLoader, m_valLoader;
    std::vector<int64_t> m_sampleShape;
    torch::Tensor m_inputMean, m_inputStd;  // csv standardisation (undefined for other data)
    int64_t m_numClasses = 0;
    torch::nn::Sequential m_model{nullptr};
    std::vector<torch::Tensor> m_params;  // the network's, then the hooks' (parameters())
    std::vector<char> m_hadGrad;          // per m_params: a gradient was seen (gradients set to none)
    bool m_wantBlocks = false;
    std::unique_ptr<MlpStep> m_mlpStep;  // a plain MLP's step without autograd (mlp_step.h)
    bool m_mlpChecked = false;
    std::unique_ptr<torch::optim::Optimizer> m_optimizer;
    std::unique_ptr<LossScaler> m_scaler;
    std::unique_ptr<Profiler> m_profiler;
    std::map<std::string, torch::Tensor> m_resumedExtras;  // the checkpoint's named tensors

    int m_rank = 0, m_world = 1;
    std::unique_ptr<DistContext> m_dist;
    std::unique_ptr<Reducer> m_reducer;

    // Model parallel: rank = (stage * replicas + replica) * tp + shard (a tensor-parallel group is
    // consecutive ranks, then a stage's replicas are neighbours). Without stages or tensor
    // parallelism every rank is a replica of the one stage.
    int m_stages = 1, m_stage = 0, m_replicas = 1, m_replica = 0, m_tp = 1, m_tpRank = 0;
    std::unique_ptr<DistContext> m_tpGroup;       // this stage's shards (tensor_parallel > 1)
    std::vector<TpSplit> m_tpPlan;                // how each layer of the network is split
    std::vector<bool> m_sharded;                  // per m_params: a shard (its norm summed over the group)
    std::vector<int64_t> m_stageBounds;           // first layer of each stage, then the layer count
    std::unique_ptr<DistContext> m_stageGroup;    // this replica's stages
    std::unique_ptr<DistContext> m_replicaGroup;  // this stage's replicas (when more than one)
    std::unique_ptr<PipelineStage> m_pipe;
    int64_t m_networkParameters = 0;  // the whole network's, before it was cut into stages

    int64_t m_startEpoch = 0, m_epochsDone = 0, m_step = 0;
    int64_t m_stepsPerEpoch = 0, m_totalSteps = 0, m_perRank = 0;
    int64_t m_batch = 0;     // the batch size in use (the spec's unless a hook changed it)
    double m_lrScale = 1.0;  // on the learning-rate schedule (a hook's)
    int64_t m_consecutiveSkips = 0;
    int64_t m_skippedSamples = 0;  // unreadable samples skipped so far (bad_samples = "skip")
    bool m_stopped = false;
    std::string m_failure;  // set by a step that ends the run
    TrainResult m_result;
};

// Device and collective engine resolution (trainer.cpp), shared with checkRunnable().
torch::Device resolveDevice(const RunSpec& spec, const DistEnv& dist = {});
std::string resolveBackend(const RunSpec& spec, torch::Device device, int ranksOnHost);

}  // namespace lathe::core
