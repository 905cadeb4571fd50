#pragma once
// Model compression: each method makes a new registered version from a parent version and
// measures it against the parent on the same data, in the same process (CompressReport).
//
//   quantize --mode dynamic   Linear layers become lathe::linear_int8 TorchScript ops on our int8
//                             GEMM (kernels/qgemm.h): per-output-channel int8 weights, each input
//                             row quantized on the fly. The artifact stays one TorchScript file;
//                             any program that loaded liblathe_torch (lathectl serve) runs it.
//   quantize --mode static    Linear and Conv2d (lathe::conv2d_int8, im2col + the same GEMM), with
//                             each layer's input scale calibrated by an observer on training
//                             batches; a following ReLU is fused into the layer.
//   quantize --mode qat       A recorded fine-tuning run of the parent's network with fake int8
//                             weights and inputs (run key qat), converted to the static int8
//                             model with the input ranges it learned.
//   prune                     Rounds of structured pruning (MLP neurons, CNN channels and the
//                             layers that read them, physically removed), each fine-tuned in a
//                             recorded run from the pruned weights (run key init_from).
//   distill                   A recorded run of a student network (a zoo spec) taught by the
//                             teacher's soft targets (run keys teacher, distill_*).
//
// Methods that train record ordinary runs (curves, checkpoints, mixed precision, data
// parallel), registered under the parent's name, or the student's.
//
// Where the work happens: core/src/compression/ (README there).
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lathe/core/registry.h"

namespace lathe::core {

class Store;

struct QuantizeOptions {
    std::string mode = "dynamic";  // dynamic | static | qat
    /// static: the activation observer (minmax, moving-average, histogram), how many batches of
    /// 32 training samples calibrate it, and the histogram's percentile of |x|.
    std::string observer = "histogram";
    int64_t calibBatches = 32;
    double percentile = 99.99;
    /// Data set to measure accuracy on (its validation split); empty = the one the parent's run
    /// trained on (a version registered from a file needs it).
    std::string data;
    int64_t seed = 0;  // 0 = the parent run's seed (the split it was validated on)
    /// qat: run keys of the fine-tuning run over the parent run's spec (defaults: epochs 3, lr a
    /// tenth of the parent's), e.g. {"epochs", "5"}, {"nproc", "2"}, {"precision", "bf16"}.
    std::map<std::string, std::string> run;
};

struct PruneOptions {
    double targetSparsity = 0.5;    // share of each prunable layer's neurons / channels removed, in (0, 1)
    int64_t rounds = 0;             // 0: as many as perRound needs
    double perRound = 0.25;         // share of the remaining ones removed per round (when rounds = 0)
    std::string importance = "l1";  // l1 (weight magnitude) | taylor (first-order, |sum w * grad|)
    int64_t finetuneEpochs = 3;
    std::map<std::string, std::string> run;  // run keys of the fine-tuning runs (lr, batch, nproc …)
    std::string data;
    int64_t seed = 0;
};

struct DistillOptions {
    ModelRef teacher;
    /// The student: a run config (.toml) or a zoo shorthand: mlp:64,64 (hidden widths),
    /// cnn:8,16 or cnn:8,16:32 (channels, then head widths).
    std::string student;
    std::string name;  // registered under this name; empty = the teacher's
    double temperature = 4.0, alpha = 0.7;
    std::string hints = "none";  // none | last | all
    double hintWeight = 1.0;
    double attentionTransfer = 0.0;          // beta; 0 = off
    std::map<std::string, std::string> run;  // run keys (epochs, lr, seed, nproc …)
    std::string data;                        // the data set; empty = the teacher run's
};

/// What a compression cost and gained, parent against compressed, measured side by side.
struct CompressReport {
    std::string method;  // "quantize"
    std::map<std::string, std::string> settings;
    std::string data;  // the data set measured on
    int64_t samples = 0;
    double accuracy = 0, parentAccuracy = 0;  // fractions in 0..1
    int64_t sizeBytes = 0, parentSizeBytes = 0;
    double latencyMsB1 = 0, latencyMsB32 = 0, parentLatencyMsB1 = 0, parentLatencyMsB32 = 0;
    std::vector<std::string> classNames;
    std::vector<double> perClassAccuracy, parentPerClassAccuracy;
    struct Layer {
        std::string name;  // "linear 0"
        std::string kind;  // "linear"
        int64_t inFeatures = 0, outFeatures = 0;
        int64_t parentOutFeatures = 0;  // the same unless pruned
        std::string change;             // "int8 weights, per-row int8 inputs, fused relu"
    };
    std::vector<Layer> layers;
    std::string kernel;  // the GEMM path that ran the measurement: "avx2", "avx512-vnni", "amx"
    int64_t parameters = 0, parentParameters = 0;
    std::vector<int64_t> runs;  // the recorded runs that trained it (qat, prune rounds, distill)
    struct Round {              // pruning: one prune + fine-tune round
        int64_t round = 0, runId = 0;
        double kept = 0;      // share of the parent's prunable neurons/channels kept
        double accuracy = 0;  // validation accuracy after its fine-tuning
        int64_t parameters = 0;
    };
    std::vector<Round> rounds;

    std::string toJson() const;
    /// Throws ConfigError when the text is not a report.
    static CompressReport fromJson(const std::string& text);
};

struct CompressResult {
    ModelVersion version;
    CompressReport report;
};

/// Progress of a compression, for a terminal line or a dialog: phase ("loading", "quantizing",
/// "measuring", "registering"), fraction done of the whole (0..1).
struct CompressProgress {
    std::string phase;
    double fraction = 0;
};

struct CompressControl {
    std::function<void(const CompressProgress&)> progress;  // may be empty
    const std::atomic<bool>* stop = nullptr;                // set: stop at the next check, nothing registered
};

/// Quantizes version `parent` of the registry into the next version of the same model, with its
/// derivation and report recorded. `store` is the workspace's run store (the parent run's data
/// and seed). Throws ConfigError (exit 2, nothing registered) for a model with no layer to
/// quantize, data that does not fit the model, an unknown mode; StoppedError when stopped.
CompressResult quantizeModel(Registry& registry, Store* store, const ModelRef& parent,
                             const QuantizeOptions& options, const CompressControl& control = {});

/// Prunes version `parent` (trained here from an mlp or cnn spec) in rounds, each fine-tuned in a
/// recorded run, into the next version of the same model. ConfigError (nothing registered) for a
/// target sparsity outside (0, 1), a parent that is not a zoo mlp/cnn run's model, bad settings.
CompressResult pruneModel(Registry& registry, Store& store, const ModelRef& parent,
                          const PruneOptions& options, const CompressControl& control = {});

/// Trains the student in a recorded run taught by the teacher, and registers it (parent model:
/// the teacher). ConfigError for a student spec that does not parse, a teacher whose outputs do not
/// match the data's classes.
CompressResult distillModel(Registry& registry, Store& store, const DistillOptions& options,
                            const CompressControl& control = {});

/// Thrown when CompressControl::stop was set: nothing was registered.
class StoppedError : public Error {
public:
    using Error::Error;
};

}  // namespace lathe::core
