#pragma once
// A loaded model version ready to run batches (torch-free interface; the TorchScript module and
// its pre-allocated batch buffer live behind the pimpl).
#include <cstdint>
#include <memory>
#include <string>

#include "lathe/core/registry.h"
#include "lathe/core/serving.h"

namespace lathe::core::serving {

class LoadedModel {
public:
    /// Loads and warms up (one full-size forward) the artifact; verifies `expectedSha256` when
    /// given. Throws Error/ConfigError with a message for the user.
    static std::shared_ptr<LoadedModel> load(const ServedModel& model, int64_t maxBatch, const std::string& device,
                                             const std::string& expectedSha256 = {});
    ~LoadedModel();

    const std::string& name() const;
    int64_t version() const;
    const ModelSignature& signature() const;
    int64_t inputElems() const;   // floats per row
    int64_t outputElems() const;  // floats per row
    int64_t maxBatch() const;
    /// The batch buffer (maxBatch × inputElems floats, pinned when serving on a GPU): the
    /// batcher copies requests' rows into it, then calls run().
    float* inputBuffer();
    /// Runs the first `rows` rows of the input buffer; writes rows × outputElems floats to `out`.
    /// Only one thread at a time.
    void run(int64_t rows, float* out);

private:
    LoadedModel();
    struct Impl;
    std::unique_ptr<Impl> d;
};

}  // namespace lathe::core::serving
