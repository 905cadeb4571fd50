#include "dist.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <mutex>

#include "lathe/core/error.h"

namespace lathe::core {

using Clock = std::chrono::steady_clock;

struct DistContext::Impl {
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

DistContext::DistContext(const DistEnv& env) : m_env(env), m_impl(std::make_unique<Impl>()) {
    const auto timeout = std::chrono::seconds(env.timeoutSec);
    try {
        c10d::TCPStoreOptions opts;
        opts.port = static_cast<uint16_t>(env.masterPort);
        opts.isServer = env.rank == 0;
        opts.numWorkers = static_cast<size_t>(env.worldSize);
        opts.waitWorkers = false;
        opts.timeout = timeout;
        m_impl->store = c10::make_intrusive<c10d::TCPStore>(env.masterAddr, opts);
        auto pgOpts = c10d::ProcessGroupGloo::Options::create();
        pgOpts->timeout = timeout;
        pgOpts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(env.masterAddr));
        m_impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(m_impl->store, env.rank, env.worldSize, pgOpts);
    } catch (const std::exception& ex) {
        std::string msg = ex.what();
        throw Error("rank " + std::to_string(env.rank) + ": rendezvous with " + env.masterAddr + ":" +
                    std::to_string(env.masterPort) + " (" + std::to_string(env.worldSize) + " ranks, timeout " +
                    std::to_string(env.timeoutSec) + " s) failed: " + msg.substr(0, msg.find('\n')));
    }
}

DistContext::~DistContext() = default;

void DistContext::broadcast(std::vector<torch::Tensor>& tensors, int root) {
    c10d::BroadcastOptions o;
    o.rootRank = root;
    for (auto& t : tensors) {
        std::vector<at::Tensor> one{t};
        m_impl->pg->broadcast(one, o)->wait();
    }
}

void DistContext::allreduceSum(torch::Tensor& t) {
    std::vector<at::Tensor> one{t};
    m_impl->pg->allreduce(one)->wait();
}

bool DistContext::any(bool flag) {
    auto t = torch::full({1}, flag ? 1.0f : 0.0f);
    std::vector<at::Tensor> one{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    m_impl->pg->allreduce(one, o)->wait();
    return t.item<float>() > 0.5f;
}

struct Reducer::Impl {
    DistContext* ctx = nullptr;
    std::vector<torch::Tensor> params;
    struct Bucket {
        std::vector<size_t> params;       // indices into `params`
        std::vector<int64_t> offsets;     // element offset of each in `buffer`
        torch::Tensor buffer;
        size_t pending = 0;
        bool launched = false;
        c10::intrusive_ptr<c10d::Work> work;
    };
    std::vector<Bucket> buckets;
    std::vector<std::pair<size_t, size_t>> where;  // param -> (bucket, slot)
    size_t nextToLaunch = 0;
    Clock::time_point firstLaunch;
    bool anyLaunched = false;
    std::mutex mutex;  // hooks may run on autograd worker threads

    void launchReady() {
        // Strictly in bucket order, so every rank issues the same collectives in the same order.
        while (nextToLaunch < buckets.size() && buckets[nextToLaunch].pending == 0) {
            auto& b = buckets[nextToLaunch++];
            if (!anyLaunched) {
                firstLaunch = Clock::now();
                anyLaunched = true;
            }
            b.buffer.div_(ctx->worldSize());
            std::vector<at::Tensor> one{b.buffer};
            b.work = ctx->impl().pg->allreduce(one);
            b.launched = true;
        }
    }

    void onGrad(size_t index, const torch::Tensor& grad) {
        std::lock_guard<std::mutex> lk(mutex);
        const auto [bi, slot] = where[index];
        auto& b = buckets[bi];
        const auto n = params[index].numel();
        b.buffer.narrow(0, b.offsets[slot], n).copy_(grad.reshape({-1}));
        if (b.pending > 0) --b.pending;
        launchReady();
    }
};

Reducer::Reducer(DistContext& ctx, std::vector<torch::Tensor> params, double bucketMb) : m_impl(std::make_unique<Impl>()) {
    auto& d = *m_impl;
    d.ctx = &ctx;
    d.params = std::move(params);
    d.where.resize(d.params.size());
    const int64_t firstCap = int64_t{1} << 20;
    const auto cap = static_cast<int64_t>(bucketMb * 1024 * 1024);
    int64_t bytes = 0;
    for (size_t k = d.params.size(); k-- > 0;) {
        const int64_t size = d.params[k].numel() * 4;
        const int64_t limit = d.buckets.size() == 1 ? firstCap : cap;  // of the bucket being filled
        if (d.buckets.empty() || (bytes > 0 && bytes + size > limit)) {
            d.buckets.emplace_back();
            bytes = 0;
        }
        auto& b = d.buckets.back();
        d.where[k] = {d.buckets.size() - 1, b.params.size()};
        b.offsets.push_back(bytes / 4);
        b.params.push_back(k);
        bytes += size;
    }
    for (auto& b : d.buckets) {
        int64_t n = 0;
        for (size_t i : b.params) n += d.params[i].numel();
        b.buffer = torch::zeros({n}, d.params.front().options().dtype(torch::kFloat));
    }
    for (size_t k = 0; k < d.params.size(); ++k)
        d.params[k].register_hook([impl = m_impl.get(), k](const torch::Tensor& grad) { impl->onGrad(k, grad); });
}

Reducer::~Reducer() = default;

void Reducer::prepare() {
    auto& d = *m_impl;
    std::lock_guard<std::mutex> lk(d.mutex);
    for (auto& b : d.buckets) {
        b.pending = b.params.size();
        b.launched = false;
        b.work.reset();
    }
    d.nextToLaunch = 0;
    d.anyLaunched = false;
}

Reducer::Stats Reducer::finish() {
    auto& d = *m_impl;
    const auto backwardEnd = Clock::now();
    Stats s;
    {
        std::lock_guard<std::mutex> lk(d.mutex);
        // A parameter that took no part in this step's graph: contribute zeros, so that the
        // collectives still match across ranks.
        for (auto& b : d.buckets)
            if (b.pending > 0 && !b.launched) {
                for (size_t slot = 0; slot < b.params.size(); ++slot) {
                    const auto& p = d.params[b.params[slot]];
                    if (!p.grad().defined()) b.buffer.narrow(0, b.offsets[slot], p.numel()).zero_();
                }
                b.pending = 0;
            }
        d.launchReady();
    }
    int64_t payload = 0;
    for (auto& b : d.buckets) {
        b.work->wait();
        payload += b.buffer.numel() * 4;
        for (size_t slot = 0; slot < b.params.size(); ++slot) {
            auto& p = d.params[b.params[slot]];
            auto avg = b.buffer.narrow(0, b.offsets[slot], p.numel()).view_as(p);
            if (p.grad().defined())
                p.mutable_grad().copy_(avg);
            else
                p.mutable_grad() = avg.clone();
        }
    }
    const auto end = Clock::now();
    s.commMs = std::chrono::duration<double, std::milli>(end - d.firstLaunch).count();
    s.exposedMs = std::chrono::duration<double, std::milli>(end - std::max(backwardEnd, d.firstLaunch)).count();
    const int n = d.ctx->worldSize();
    s.bytesSent = payload * 2 * (n - 1) / n;
    s.buckets = static_cast<int>(d.buckets.size());
    return s;
}

}  // namespace lathe::core
