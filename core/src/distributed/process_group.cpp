#include "distributed/process_group.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "distributed/process_group_impl.h"
#include "lathe/core/error.h"

namespace lathe::core {

bool DistContext::ncclBuilt() {
#ifdef USE_C10D_NCCL
    return true;
#else
    return false;
#endif
}

DistContext::DistContext(const DistEnv& env, const std::string& backend, torch::Device device)
    : m_env(env), m_backend(backend), m_impl(std::make_unique<Impl>()) {
    if (backend != "gloo" && backend != "nccl")
        throw ConfigError("`backend` must be gloo or nccl (got '" + backend + "')");
    if (backend == "nccl") {
        if (!ncclBuilt())
            throw ConfigError("`backend` nccl: this LibTorch was built without NCCL; use backend = \"gloo\"");
        if (!device.is_cuda())
            throw ConfigError(
                "`backend` nccl exchanges CUDA tensors: train with device = \"cuda\", or use backend = "
                "\"gloo\"");
        m_device = device;
        m_impl->nccl = true;
    }
    m_impl->masterAddr = env.masterAddr;
    m_impl->bindAddr = env.bindAddr;
    const auto timeout = std::chrono::seconds(env.timeoutSec);
    try {
        c10d::TCPStoreOptions opts;
        opts.port = static_cast<uint16_t>(env.masterPort);
        opts.isServer = env.rank == 0;
        opts.numWorkers = static_cast<size_t>(env.worldSize);
        opts.waitWorkers = false;
        opts.timeout = timeout;
        m_impl->store = c10::make_intrusive<c10d::TCPStore>(env.masterAddr, opts);
        // Collectives wait much longer than the rendezvous: rank 0 validates and checkpoints
        // while the others wait at their next collective (torch's default is 30 minutes).
        m_impl->timeout = std::max(timeout, std::chrono::seconds(1800));
        m_impl->pg = m_impl->group(m_impl->store, env.rank, env.worldSize);
    } catch (const std::exception& ex) {
        std::string msg = ex.what();
        throw Error("rank " + std::to_string(env.rank) + ": rendezvous with " + env.masterAddr + ":" +
                    std::to_string(env.masterPort) + " (" + std::to_string(env.worldSize) +
                    " ranks, timeout " + std::to_string(env.timeoutSec) +
                    " s) failed: " + msg.substr(0, msg.find('\n')));
    }
}

DistContext::~DistContext() = default;

void DistContext::initHierarchy(int ranksPerHost) {
    const int world = m_env.worldSize;
    if (ranksPerHost <= 0 || world % ranksPerHost != 0)
        throw ConfigError("`ranks_per_host` " + std::to_string(ranksPerHost) + " must divide the " +
                          std::to_string(world) + " ranks");
    m_ranksPerHost = ranksPerHost;
    auto group = [&](const std::string& prefix, int rank, int size) {
        return m_impl->group(c10::make_intrusive<c10d::PrefixStore>(prefix, m_impl->store), rank, size);
    };
    const int host = m_env.rank / ranksPerHost;
    m_impl->host = group("lathe/host/" + std::to_string(host), m_env.rank % ranksPerHost, ranksPerHost);
    if (m_env.rank % ranksPerHost == 0) m_impl->leaders = group("lathe/leaders", host, world / ranksPerHost);
}

std::unique_ptr<DistContext> DistContext::subgroup(const std::string& name, int rank, int size) {
    if (rank < 0 || rank >= size)
        throw Error("subgroup " + name + ": rank " + std::to_string(rank) + " of " + std::to_string(size));
    std::unique_ptr<DistContext> sub(new DistContext());
    sub->m_env = m_env;
    sub->m_env.rank = rank;
    sub->m_env.worldSize = size;
    sub->m_backend = m_backend;
    sub->m_device = m_device;
    sub->m_impl = std::make_unique<Impl>();
    auto& i = *sub->m_impl;
    i.store = m_impl->store;
    i.timeout = m_impl->timeout;
    i.masterAddr = m_impl->masterAddr;
    i.bindAddr = m_impl->bindAddr;
    i.nccl = m_impl->nccl;
    i.pg = i.group(c10::make_intrusive<c10d::PrefixStore>("lathe/" + name, m_impl->store), rank, size);
    return sub;
}

// Tensors travel on the context's device: a tensor elsewhere goes through a copy there and back.
void DistContext::broadcast(std::vector<torch::Tensor>& tensors, int root) {
    c10d::BroadcastOptions o;
    o.rootRank = root;
    for (auto& t : tensors) {
        const bool here = t.device() == m_device;
        std::vector<at::Tensor> one{here ? t : t.to(m_device)};
        m_impl->pg->broadcast(one, o)->wait();
        if (!here) t.copy_(one[0]);
    }
}

void DistContext::allreduceSum(torch::Tensor& t) {
    const bool here = t.device() == m_device;
    std::vector<at::Tensor> one{here ? t : t.to(m_device)};
    m_impl->pg->allreduce(one)->wait();
    if (!here) t.copy_(one[0]);
}

bool DistContext::any(bool flag) {
    auto t = torch::full({1}, flag ? 1.0f : 0.0f, torch::TensorOptions().device(m_device));
    std::vector<at::Tensor> one{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    m_impl->pg->allreduce(one, o)->wait();
    return t.item<float>() > 0.5f;
}

// Sizes first, then the bytes, through host memory (Gloo) or the GPU (NCCL).
void DistContext::sendBytes(const std::string& bytes, int dst, int tag) {
    std::vector<at::Tensor> size{
        torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kLong).to(m_device)};
    m_impl->pg->send(size, dst, 2 * tag)->wait();
    if (bytes.empty()) return;
    auto data = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
    std::memcpy(data.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    std::vector<at::Tensor> one{data.to(m_device)};
    m_impl->pg->send(one, dst, 2 * tag + 1)->wait();
}

std::string DistContext::recvBytes(int src, int tag) {
    std::vector<at::Tensor> size{
        torch::zeros({1}, torch::TensorOptions().dtype(torch::kLong).device(m_device))};
    m_impl->pg->recv(size, src, 2 * tag)->wait();
    const auto n = size[0].cpu().item<int64_t>();
    if (n <= 0) return {};
    std::vector<at::Tensor> one{
        torch::empty({n}, torch::TensorOptions().dtype(torch::kUInt8).device(m_device))};
    m_impl->pg->recv(one, src, 2 * tag + 1)->wait();
    const auto host = one[0].cpu();
    return std::string(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

}  // namespace lathe::core
