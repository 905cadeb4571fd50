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
    std::string mode = "dynamic";  // dynamic | static
    /// static: the activation observer (minmax, moving-average, histogram), how many batches of
    /// 32 training samples calibrate it, and the histogram's percentile of |x|.
    std::string observer = "histogram";
    int64_t calibBatches = 32;
    double percentile = 99.99;
    /// Data set to measure accuracy on (its validation split); empty = the one the parent's run
    /// trained on (a version registered from a file needs it).
    std::string data;
    int64_t seed = 0;  // 0 = the parent run's seed (the split it was validated on)
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
CompressResult quantizeModel(Registry& registry, const Store* store, const ModelRef& parent,
                             const QuantizeOptions& options, const CompressControl& control = {});

/// Thrown when CompressControl::stop was set: nothing was registered.
class StoppedError : public Error {
public:
    using Error::Error;
};

}  // namespace lathe::core
