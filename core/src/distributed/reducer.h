#pragma once
// Data-parallel gradient exchange (private: LibTorch types).
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace lathe::core {

/// DDP-style gradient averaging: parameters are grouped into buckets in reverse registration
/// order (the first bucket 1 MB, the others `bucketMb`). From the first exchange on, each fp32
/// gradient is an alias of its slice of the bucket, so backward adds into the bucket; a hook
/// after each parameter's gradient accumulator marks it ready (copying it in where it cannot
/// alias), and a full bucket's exchange starts while backward continues (the ring's asynchronous
/// all-reduce, or the other exchanges on a communication thread). Buckets launch in the same
/// order on every rank.
/// Gradient compression on the wire (see Reducer).
struct CompressOptions {
    std::string strategy = "ring";  // ring | hierarchical | ps
    int psRanks = 1;
    std::string format = "none";  // none | fp16 | bf16 | int8 | int4
    bool errorFeedback = false;
    int64_t chunk = 2048;  // elements per int8/int4 scale
    bool stochastic = false;
    uint64_t seed = 0;
};

class Reducer {
public:
    /// With compression, each bucket is exchanged as a reduce-scatter and an all-gather of
    /// compressed shards: every rank sends shard j of its (error-fed) compressed gradient to
    /// rank j, which dequantizes and sums them in FP32, compresses the averaged shard again and
    /// all-gathers it; quantized values are never summed in low precision.
    /// `sparse`: indices of parameters with sparse gradients (embedding tables). With the ps
    /// strategy only their touched rows travel: every rank pushes (row, value) pairs to the
    /// server, which sums them and sends back the union of touched rows.
    /// `overlap` false: no backward hooks; finish() takes the gradients as they stand (after
    /// several backward passes have accumulated them: a pipeline's micro-batches).
    Reducer(DistContext& ctx, std::vector<torch::Tensor> params, double bucketMb,
            CompressOptions compress = {}, std::vector<size_t> sparse = {}, bool overlap = true);
    ~Reducer();
    /// Before backward. `step` seeds stochastic rounding.
    void prepare(int64_t step = 0);
    struct Stats {
        double commMs = 0;              // first launch to last completion
        double exposedMs = 0;           // of that, after backward had finished
        int64_t bytesSent = 0;          // by this rank (ring all-reduce: 2 (n-1)/n of the payload)
        double compressionRatio = 1.0;  // fp32 ring bytes / bytes actually sent
        int buckets = 0;
    };
    /// After backward: launches what is left, waits, and writes the averaged gradients back.
    Stats finish();
    /// Error-feedback residuals are kept in the units of the gradients they came from: loss-scaled
    /// ones under a loss scaler. When the scale changes (new = old * factor) they are multiplied
    /// by `factor`, so the error carried into the next step keeps its true size.
    void rescaleResiduals(double factor);

    /// Error-feedback residuals of every rank, for rank 0's checkpoint, named
    /// residualPrefix(rank) + "<bucket>.residual|shard". A collective: every rank calls it at the
    /// same point (after finish()). Empty without error feedback.
    std::map<std::string, torch::Tensor> gatherResiduals();
    /// Takes this rank's residuals from a checkpoint's extras (other names are ignored); they are
    /// put in place when each bucket's buffers are first allocated, so a resumed compressed run
    /// carries exactly the error the interrupted one would have. Throws CheckpointError then if
    /// they do not fit.
    void restoreResiduals(const std::map<std::string, torch::Tensor>& extras);
    /// The exchange strategy with its particulars, for the log ("ps (2 server ranks)").
    std::string strategy() const;
    /// "ef.r<rank>.b": the start of rank `rank`'s residual names.
    static std::string residualPrefix(int rank);

private:
    struct Impl;
    std::unique_ptr<Impl> m_impl;
};

}  // namespace lathe::core
