#pragma once
// A loaded model version ready to run batches (torch-free interface; the TorchScript module and
// its pre-allocated batch buffer live behind the pimpl).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lathe/core/registry.h"
#include "lathe/core/server.h"

namespace lathe::core::serving {

class LoadedModel {
public:
    /// Loads and warms up (one full-size forward) the artifact; verifies `expectedSha256` when
    /// given. Throws Error/ConfigError with a message for the user.
    /// `instances` batches may run at once (Triton's instance_group count), each with its own
    /// batch buffer; the TorchScript module itself is shared (its forward is reentrant).
    ///
    /// `optimize` (ServeOptions::optimize): "off" runs the module as loaded; "on" and "auto" build
    /// a frozen copy with TorchScript's inference optimisations (optimizedForInference in
    /// artifact_io.h: linear fusion, freeze, optimize_for_inference) on a CPU. The copy must agree
    /// with the loaded module on a fixed max-batch probe (same shape, same non-finite values,
    /// finite ones within 1e-4 (1 + max |y|)). "auto" then keeps the copy only if it is >= 5%
    /// faster at max-batch and no more than 5% slower on one row, and nothing the copy does can
    /// fail the load; "on" keeps it whenever it agrees and fails the load when it cannot be
    /// built, run, or does not agree. See optimization().
    ///
    /// The model itself lives in the torch-backed library (serving/model_runner.cpp), loaded on
    /// the first call (torch_backend.h).
    static std::shared_ptr<LoadedModel> load(const ServedModel& model, int64_t maxBatch,
                                             const std::string& device,
                                             const std::string& expectedSha256 = {}, int instances = 1,
                                             const std::string& optimize = "off");
    virtual ~LoadedModel() = default;

    const std::string& name() const { return m_model.name; }
    int64_t version() const { return m_model.version; }
    const ModelSignature& signature() const { return m_signature; }
    int64_t inputElems() const { return m_inElems; }    // floats per row
    int64_t outputElems() const { return m_outElems; }  // floats per row
    int64_t maxBatch() const { return m_maxBatch; }
    int instances() const { return m_instances; }
    /// What load did about optimisation, for the log: "optimized for inference: 2.10 ms vs 2.84 ms
    /// per 32-row batch, 0.57 ms vs 1.45 ms per row" or "kept as loaded: <why>"; empty with "off"
    /// or on a GPU.
    const std::string& optimization() const { return m_optimization; }
    /// Instance `i`'s batch buffer (maxBatch × inputElems floats, pinned when serving on a GPU):
    /// the batcher copies requests' rows into it, then calls run(i, ...).
    virtual float* inputBuffer(int instance = 0) = 0;
    /// Runs the first `rows` rows of instance `i`'s buffer; writes rows × outputElems floats to
    /// `out`. One thread at a time per instance; different instances may run concurrently.
    virtual void run(int instance, int64_t rows, float* out) = 0;

protected:
    LoadedModel() = default;
    ServedModel m_model;
    ModelSignature m_signature;
    int64_t m_inElems = 1, m_outElems = 1, m_maxBatch = 1;
    int m_instances = 0;
    std::string m_optimization;
};

/// Which batch sizes to pad, from the forward's time at every size (`ms[b]` for b rows, index 0
/// unused): a batch of b rows runs as the size p >= b with the least time, when that is at
/// least 15% less than b's own. Returns runRows[b] (empty when no size gains) and describes the
/// choice in `note`. In the torch-backed library; the server times the sizes at load.
std::vector<int64_t> choosePadding(const std::vector<double>& ms, std::string& note);

}  // namespace lathe::core::serving
