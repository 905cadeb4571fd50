#pragma once
// Data-parallel plumbing on c10d (private: LibTorch types). Gloo on the CPU (CUDA gradients are
// staged through host memory), NCCL on CUDA GPUs when the LibTorch was built with it.
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "lathe/core/distributed.h"

namespace lathe::core {

class DistContext {
public:
    /// Rendezvous through a TCP store on MASTER_ADDR:MASTER_PORT (rank 0 serves it) within
    /// env.timeoutSec, then a process group: `backend` "gloo", or "nccl" on `device` (a CUDA
    /// device of this rank's own). Throws Error naming the address on timeout, ConfigError when
    /// NCCL is asked for and cannot be had.
    explicit DistContext(const DistEnv& env, const std::string& backend = "gloo",
                         torch::Device device = torch::kCPU);
    ~DistContext();
    int rank() const { return m_env.rank; }
    int worldSize() const { return m_env.worldSize; }
    /// "gloo" or "nccl".
    const std::string& backend() const { return m_backend; }
    /// Where collectives take their tensors: the CPU for Gloo, this rank's GPU for NCCL.
    torch::Device commDevice() const { return m_device; }
    /// Whether this LibTorch build has c10d's NCCL process group.
    static bool ncclBuilt();

    void broadcast(std::vector<torch::Tensor>& tensors, int root = 0);
    /// Blocking sum over ranks, in place.
    void allreduceSum(torch::Tensor& t);
    /// Whether any rank says yes (all ranks must call it at the same point).
    bool any(bool flag);
    /// Hierarchical groups: ranks of one host (rank / ranksPerHost), and the hosts' leaders
    /// (local rank 0). Throws ConfigError when ranksPerHost does not divide the world.
    void initHierarchy(int ranksPerHost);
    int ranksPerHost() const { return m_ranksPerHost; }

    struct Impl;
    Impl& impl() { return *m_impl; }

private:
    DistEnv m_env;
    std::string m_backend = "gloo";
    torch::Device m_device = torch::kCPU;
    int m_ranksPerHost = 0;
    std::unique_ptr<Impl> m_impl;
};

/// DDP-style gradient averaging: parameters are grouped into buckets in reverse registration
/// order (the first bucket 1 MB, the others `bucketMb`); autograd hooks copy each gradient into
/// its bucket as backward produces it, and a full bucket's exchange starts while backward
/// continues (the ring's asynchronous all-reduce, or the other exchanges on a communication
/// thread). Buckets launch in the same order on every rank.
/// Gradient compression on the wire (see Reducer).
struct CompressOptions {
    std::string strategy = "ring";  // ring | hierarchical | ps
    int psRanks = 1;
    std::string format = "none";  // none | fp16 | bf16 | int8 | int4
    bool errorFeedback = false;
    int64_t chunk = 2048;           // elements per int8/int4 scale
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
    Reducer(DistContext& ctx, std::vector<torch::Tensor> params, double bucketMb, CompressOptions compress = {},
            std::vector<size_t> sparse = {});
    ~Reducer();
    /// Before backward. `step` seeds stochastic rounding.
    void prepare(int64_t step = 0);
    struct Stats {
        double commMs = 0;      // first launch to last completion
        double exposedMs = 0;   // of that, after backward had finished
        int64_t bytesSent = 0;  // by this rank (ring all-reduce: 2 (n-1)/n of the payload)
        double compressionRatio = 1.0;  // fp32 ring bytes / bytes actually sent
        int buckets = 0;
    };
    /// After backward: launches what is left, waits, and writes the averaged gradients back.
    Stats finish();
    /// Error-feedback residuals are kept in the units of the gradients they came from: loss-scaled
    /// ones under a loss scaler. When the scale changes (new = old * factor) they are multiplied
    /// by `factor`, so the error carried into the next step keeps its true size.
    void rescaleResiduals(double factor);

private:
    struct Impl;
    std::unique_ptr<Impl> m_impl;
};

}  // namespace lathe::core
