#pragma once
// Data-parallel plumbing on c10d (private: LibTorch types). Gloo on the CPU (CUDA gradients are
// staged through host memory), NCCL on CUDA GPUs when the LibTorch was built with it.
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "lathe/core/launcher.h"

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
    /// Point to point: `bytes` to rank `dst`, which takes them with recvBytes(this rank, tag).
    /// Blocking (for checkpoint files gathered on rank 0).
    void sendBytes(const std::string& bytes, int dst, int tag);
    std::string recvBytes(int src, int tag);
    /// Hierarchical groups: ranks of one host (rank / ranksPerHost), and the hosts' leaders
    /// (local rank 0). Throws ConfigError when ranksPerHost does not divide the world.
    void initHierarchy(int ranksPerHost);
    int ranksPerHost() const { return m_ranksPerHost; }
    /// A context over a subgroup of this one's ranks, on the same rendezvous store: every member
    /// calls it with the same `name` and its own `rank` in 0..size-1; non-members do not call it.
    /// Collectives on the result involve the members only (a pipeline's stages, one stage's
    /// data-parallel replicas).
    std::unique_ptr<DistContext> subgroup(const std::string& name, int rank, int size);

    struct Impl;
    Impl& impl() { return *m_impl; }

private:
    DistContext() = default;  // subgroup()
    DistEnv m_env;
    std::string m_backend = "gloo";
    torch::Device m_device = torch::kCPU;
    int m_ranksPerHost = 0;
    std::unique_ptr<Impl> m_impl;
};

}  // namespace lathe::core
