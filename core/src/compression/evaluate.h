#pragma once
// Measuring a compressed model against its parent (private: LibTorch types): the data both are
// measured on, accuracy (overall and per class) and latency at batch 1 and 32, parent and
// compressed alternated in one process so that a noisy machine treats both alike; and the
// progress/stop bookkeeping every compression method shares.
#include <torch/script.h>

#include <string>
#include <utility>
#include <vector>

#include "lathe/core/compress.h"

namespace lathe::core::compression {

struct EvalData {
    std::string name;  // the data set
    torch::Tensor x;   // validation samples as the model takes them (raw: a csv model standardises itself)
    torch::Tensor y;   // labels (long)
    std::vector<std::string> classNames;
    torch::Tensor calibration;  // the training split, as the model takes it (static quantization)
};

/// The validation split of the data the parent was trained on (its run's spec), or of
/// `dataOverride`; `seed` > 0 replaces the split seed. Checks that the samples fit the parent's
/// signature (input shape, number of classes). Throws ConfigError with what to pass instead.
EvalData evaluationData(const Registry& registry, const Store* store, const ModelVersion& parent,
                        const std::string& dataOverride, int64_t seed);

/// Phases with their share of the whole; begin() reports and checks the stop flag (StoppedError).
class Progress {
public:
    Progress(const CompressControl& control, std::vector<std::pair<std::string, double>> phases);
    void begin(const std::string& phase);
    void within(double fraction);  // of the current phase; also checks the stop flag
    void update(double fraction);  // of the current phase, without the check (from a training run)
    void done();

private:
    void report(double fraction);
    const CompressControl& m_control;
    std::vector<std::pair<std::string, double>> m_phases;
    std::string m_phase;
    double m_start = 0, m_share = 0;
};

struct Accuracy {
    double overall = 0;
    std::vector<double> perClass;
};
Accuracy accuracyOf(torch::jit::Module& module, const EvalData& data);

/// Accuracy of both and latency at batch 1 and 32 of both, into `report` (all but sizes).
void measurePair(torch::jit::Module& parent, torch::jit::Module& child, const EvalData& data,
                 CompressReport& report, Progress& progress);

}  // namespace lathe::core::compression
