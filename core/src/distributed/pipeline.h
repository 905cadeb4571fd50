#pragma once
// Pipeline parallelism (private: LibTorch types). The network, a Sequential, is cut into S
// stages of consecutive layers, one per process of a pipeline group; a step's batch is split
// into M micro-batches whose activations travel forward and whose gradients travel back
// between neighbouring stages with c10d send/recv, on a GPipe or a 1F1B schedule. Gradients
// accumulate over the micro-batches; the optimizer steps once per batch, as in one process.
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lathe/core/checkpoint.h"  // shardCheckpointPath
#include "training/zoo.h"

namespace lathe::core {

class DistContext;
class Profiler;

/// Where the stages start: bounds[s] is the first layer (index into the Sequential) of stage s,
/// bounds[S] the number of layers.
using StageBounds = std::vector<int64_t>;

/// Units a stage may start at: each layer with parameters, with the parameter-free layers that
/// follow it (activation, pooling, dropout) and, for the first unit, any that precede it.
/// Returns each unit's first layer and the layer count as the last entry.
std::vector<int64_t> pipelineUnits(torch::nn::Sequential& model);

/// Cuts `weights` (one per unit) into `stages` contiguous parts minimising the heaviest part
/// (a linear partition, exact). Throws ConfigError when there are fewer units than stages.
StageBounds balanceStages(const std::vector<int64_t>& unitStarts, const std::vector<double>& weights,
                          int stages);
/// Parameters per unit (`balance = "params"`).
std::vector<double> unitParameterWeights(torch::nn::Sequential& model, const std::vector<int64_t>& units);
/// Forward-and-backward seconds per unit on `sample` (`balance = "time"`), median of a few runs.
std::vector<double> unitTimeWeights(torch::nn::Sequential& model, const std::vector<int64_t>& units,
                                    const torch::Tensor& sample);

/// Layers [begin, end) of `model` as a Sequential that shares them and keeps their names ("3",
/// "4" …), so its state loads into (and from) the whole network's under the same keys.
torch::nn::Sequential stageModel(torch::nn::Sequential& model, int64_t begin, int64_t end);

/// What crosses the boundary in front of each stage for one sample: shape (without the batch
/// dimension) and dtype, found by running the network once on a sample of batch 1 under the
/// run's autocast. Entry s is the input of stage s (entry 0: the data).
struct BoundaryShape {
    std::vector<int64_t> shape;
    c10::ScalarType dtype = c10::ScalarType::Float;
};
std::vector<BoundaryShape> boundaryShapes(torch::nn::Sequential& model, const StageBounds& bounds,
                                          const torch::Tensor& sample1,
                                          c10::optional<c10::ScalarType> autocast, c10::DeviceType device);

/// The order in which one stage runs its micro-batches' forward (F) and backward (B) passes.
/// GPipe: every forward, then every backward (in reverse). 1F1B: S-s-1 forwards to fill the
/// pipe, then one forward and one backward in turn, then the remaining backwards; a stage holds
/// at most S-s micro-batches' activations at once.
struct PipeOp {
    bool forward = true;
    int micro = 0;
};
std::vector<PipeOp> pipelineSchedule(const std::string& schedule, int stage, int stages, int micro);

/// One pipeline stage of a data-parallel replica. `group`: the pipeline group (its rank is the
/// stage). Sends are asynchronous: a thread of the stage waits for each (Gloo's send completes once
/// the receiver has its data) and lets its tensor go, so neighbours never wait on each other's
/// sends and a received activation is not kept; the step ends when all are received.
class PipelineStage {
public:
    struct Options {
        std::string schedule = "1f1b";  // gpipe | 1f1b
        int microBatches = 4;
        ForwardOptions forward;  // autocast and activation checkpointing within the stage
        torch::Device device = torch::kCPU;
    };
    PipelineStage(DistContext& group, torch::nn::Sequential stage, std::vector<BoundaryShape> boundaries,
                  Options options);
    ~PipelineStage();
    PipelineStage(const PipelineStage&) = delete;
    PipelineStage& operator=(const PipelineStage&) = delete;

    int stage() const { return m_stage; }
    int stages() const { return m_stages; }
    bool first() const { return m_stage == 0; }
    bool last() const { return m_stage + 1 == m_stages; }

    /// The last stage's loss for one micro-batch: its logits (FP32) and labels; the result is
    /// the micro-batch's mean loss, which the stage weights by its share of the batch.
    using LossFn = std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& labels)>;
    /// Scales the weighted micro-batch loss before backward (the loss scaler's).
    using ScaleFn = std::function<torch::Tensor(const torch::Tensor& loss)>;

    struct StepStats {
        double loss = 0;        // last stage: the batch's mean loss (sum of weighted micro losses)
        int64_t correct = 0;    // last stage: predictions that match
        double forwardMs = 0;   // this stage's compute in forward passes
        double backwardMs = 0;  // and in backward passes
        double stepMs = 0;      // the whole schedule, first op to last send completed
        double bubble = 0;      // 1 - (forward + backward) / step: this stage's idle share
        int64_t bytesSent = 0;  // activations and gradients this stage sent
        int maxInFlight = 0;    // micro-batches whose activations were held at once
        int microBatches = 0;   // as the batch was split (fewer when the batch is smaller than M)
    };
    /// One training step's forward and backward over the batch's micro-batches (x on the first
    /// stage, y on the last; other stages need only the batch's size). Gradients accumulate in
    /// the stage's parameters.
    StepStats step(const torch::Tensor& x, const torch::Tensor& y, int64_t batchRows, const LossFn& loss,
                   const ScaleFn& scale, Profiler* profiler);
    /// Forward only (evaluation): returns the last stage's logits in FP32 (an undefined tensor on
    /// the other stages).
    torch::Tensor forward(const torch::Tensor& x, int64_t rows);

private:
    torch::Tensor receive(int from, int tag, int64_t rows, const BoundaryShape& b);
    void send(torch::Tensor t, int to, int tag);
    void sendLoop();
    /// Until every send of this stage has been received (rethrows a failed one).
    void waitSends();

    DistContext& m_group;
    torch::nn::Sequential m_model;
    std::vector<BoundaryShape> m_boundaries;
    Options m_options;
    int m_stage = 0, m_stages = 1;
    // Sends in flight, waited for in order by m_sendThread (each work holds its tensor).
    std::mutex m_sendMutex;
    std::condition_variable m_sendCv;
    std::deque<c10::intrusive_ptr<c10d::Work>> m_sends;
    int m_sendsPending = 0;
    bool m_stopSends = false;
    std::exception_ptr m_sendError;
    std::thread m_sendThread;
    int64_t m_bytesSent = 0;
};

}  // namespace lathe::core
