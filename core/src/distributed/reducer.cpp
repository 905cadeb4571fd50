// Gradient averaging across ranks: buckets, overlap with backward, the communication thread and
// error-feedback residuals across checkpoints. How a bucket is averaged is the strategy's
// (exchange.h: ring, hierarchical, ps), found by its name.
#include "distributed/reducer.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "distributed/exchange.h"
#include "distributed/process_group_impl.h"
#include "lathe/core/error.h"
#include "lathe/kernels/cuda_device.h"

namespace lathe::core {

using Clock = std::chrono::steady_clock;

namespace kc = lathe::kernels;

struct Reducer::Impl {
    DistContext* ctx = nullptr;
    CompressOptions compress;
    std::unique_ptr<Codec> codec;
    std::unique_ptr<ExchangeStrategy> strategy;
    std::vector<torch::Tensor> params;
    std::vector<Bucket> buckets;
    bool overlap = true;                           // backward hooks fill the buckets
    std::vector<size_t> sparse;                    // params with sparse gradients (not in buckets)
    std::vector<std::pair<size_t, size_t>> where;  // param -> (bucket, slot)
    size_t nextToLaunch = 0;
    Clock::time_point firstLaunch;
    bool anyLaunched = false;
    std::mutex mutex;  // hooks may run on autograd worker threads
    int64_t step = 0;
    // Residuals read from a checkpoint (restoreResiduals), by name, until their bucket's buffers
    // are allocated on its first compressed exchange.
    std::map<std::string, torch::Tensor> pendingResiduals;
    // The post hooks on the parameters' gradient accumulators (held: a leaf keeps its accumulator
    // only weakly), removed when the reducer goes.
    std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks;

    static std::string residualName(int rank, size_t bucket, bool shard) {
        return residualPrefix(rank) + std::to_string(bucket) + (shard ? ".shard" : ".residual");
    }

    // Fills a freshly allocated bucket's residuals from a checkpoint, if one was restored.
    void takePending(size_t bucketIndex, Bucket& b) {
        if (pendingResiduals.empty()) return;
        const int rank = ctx->rank();
        for (const bool shard : {false, true}) {
            auto& dst = shard ? b.shardResidual : b.residual;
            const auto it = pendingResiduals.find(residualName(rank, bucketIndex, shard));
            if (it == pendingResiduals.end()) continue;
            if (!dst.defined() || it->second.numel() != dst.numel())
                throw CheckpointError("the checkpoint's error-feedback residuals of bucket " +
                                      std::to_string(bucketIndex) + " do not fit this run's buckets");
            torch::NoGradGuard noGrad;
            dst.copy_(it->second.reshape_as(dst));
            pendingResiduals.erase(it);
        }
    }

    // Compressed, hierarchical and ps exchanges are several blocking collectives each: a
    // communication thread runs them bucket by bucket as backward fills the buckets, so they
    // overlap with the rest of backward as the plain ring's asynchronous all-reduce does. Buckets
    // are queued strictly in order, so every rank issues the same collectives in the same order.
    std::thread commThread;
    std::mutex commMutex;
    std::condition_variable commCv;
    std::deque<size_t> commQueue;
    size_t commDone = 0;
    int64_t commSent = 0;
    bool commStop = false;
    std::exception_ptr commError;

    ~Impl() {
        {
            std::lock_guard<std::mutex> lk(commMutex);
            commStop = true;
        }
        commCv.notify_all();
        if (commThread.joinable()) commThread.join();
    }

    void commLoop() {
        // The CUDA runtime's current device is per thread: this thread's compression kernels
        // must run on the rank's GPU, not on device 0.
        if (codec->onGpu()) kc::cuda::setDevice(ctx->commDevice().index());
        for (;;) {
            size_t bi;
            {
                std::unique_lock<std::mutex> lk(commMutex);
                commCv.wait(lk, [&] { return commStop || !commQueue.empty(); });
                if (commQueue.empty()) return;
                bi = commQueue.front();
                commQueue.pop_front();
            }
            int64_t sent = 0;
            std::exception_ptr error;
            try {
                sent = strategy->exchange(buckets[bi], bi, step);
            } catch (...) {
                error = std::current_exception();
            }
            {
                std::lock_guard<std::mutex> lk(commMutex);
                commSent += sent;
                ++commDone;
                if (error && !commError) commError = error;
            }
            commCv.notify_all();
        }
    }

    void launchReady() {
        // Strictly in bucket order, so every rank issues the same collectives in the same order.
        while (nextToLaunch < buckets.size() && buckets[nextToLaunch].pending == 0) {
            const size_t bi = nextToLaunch++;
            auto& b = buckets[bi];
            if (!anyLaunched) {
                firstLaunch = Clock::now();
                anyLaunched = true;
            }
            b.launched = true;
            if (!strategy->asynchronous()) {
                {
                    std::lock_guard<std::mutex> lk(commMutex);
                    commQueue.push_back(bi);
                }
                commCv.notify_one();
                continue;
            }
            b.work = strategy->launch(b);
        }
    }

    // Whether `grad` is parameter `index`'s slice of its bucket (what gradFor handed out).
    bool isBucketView(size_t index, const torch::Tensor& grad) const {
        const auto [bi, slot] = where[index];
        const auto& b = buckets[bi];
        return grad.defined() && grad.is_contiguous() && grad.numel() == params[index].numel() &&
               grad.device() == b.buffer.device() && grad.scalar_type() == b.buffer.scalar_type() &&
               grad.data_ptr() == static_cast<void*>(b.buffer.data_ptr<float>() + b.offsets[slot]);
    }

    // Parameter `index`'s gradient as an alias of its slice of the bucket, as PyTorch DDP's
    // gradient_as_bucket_view: backward then adds into the bucket and the averaged result is the
    // gradient, with no copy in or out. An alias of the storage, not an autograd view, so that
    // Optimizer::zero_grad's detach_() accepts it. None where the parameter is not an fp32 tensor
    // on the communication device (a GPU model exchanged by Gloo through host memory).
    torch::Tensor gradFor(size_t index) const {
        const auto& p = params[index];
        const auto [bi, slot] = where[index];
        const auto& b = buckets[bi];
        if (p.device() != b.buffer.device() || p.scalar_type() != torch::kFloat) return {};
        torch::NoGradGuard noGrad;
        return torch::empty({0}, b.buffer.options())
            .set_(b.buffer.storage(), b.buffer.storage_offset() + b.offsets[slot], p.sizes());
    }

    // Parameter `index`'s gradient for this step is complete (backward accumulated it): into the
    // bucket with it, unless it is there already, and launch what is ready.
    void onGrad(size_t index) {
        std::lock_guard<std::mutex> lk(mutex);
        const auto [bi, slot] = where[index];
        auto& b = buckets[bi];
        const auto& grad = params[index].grad();
        const auto n = params[index].numel();
        if (!grad.defined())
            b.buffer.narrow(0, b.offsets[slot], n).zero_();
        else if (!isBucketView(index, grad))
            b.buffer.narrow(0, b.offsets[slot], n).copy_(grad.reshape({-1}));
        if (!b.ready[slot]) {
            b.ready[slot] = 1;
            if (b.pending > 0) --b.pending;
        }
        launchReady();
    }
};

Reducer::Reducer(DistContext& ctx, std::vector<torch::Tensor> params, double bucketMb,
                 CompressOptions compress, std::vector<size_t> sparse, bool overlap)
    : m_impl(std::make_unique<Impl>()) {
    auto& d = *m_impl;
    d.overlap = overlap;
    d.ctx = &ctx;
    d.compress = compress;
    d.codec = std::make_unique<Codec>(compress, ctx.commDevice());
    ExchangeEnv env;
    env.ctx = &ctx;
    env.codec = d.codec.get();
    env.options = compress;
    env.residualsAllocated = [impl = m_impl.get()](size_t bi, Bucket& b) { impl->takePending(bi, b); };
    d.strategy = makeExchangeStrategy(compress.strategy, std::move(env));
    d.params = std::move(params);
    if (!sparse.empty() && !d.strategy->takesSparse())
        throw ConfigError(std::string("sparse embedding gradients are not exchanged by the ") +
                          d.strategy->name() + " strategy; use strategy = \"ps\"");
    d.sparse = std::move(sparse);
    auto isSparse = [&](size_t k) {
        return std::find(d.sparse.begin(), d.sparse.end(), k) != d.sparse.end();
    };
    d.where.resize(d.params.size());
    const int64_t firstCap = int64_t{1} << 20;
    const auto cap = static_cast<int64_t>(bucketMb * 1024 * 1024);
    int64_t bytes = 0;
    for (size_t k = d.params.size(); k-- > 0;) {
        if (isSparse(k)) continue;  // exchanged row by row in finish()
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
        // Gloo takes host memory: a model on a GPU has its gradients staged through the CPU.
        b.buffer = torch::zeros({n}, torch::TensorOptions().dtype(torch::kFloat).device(ctx.commDevice()));
    }
    if (!d.strategy->asynchronous()) d.commThread = std::thread([impl = m_impl.get()] { impl->commLoop(); });
    // Overlap: each parameter's bucket slot is filled once backward has accumulated its gradient,
    // by a hook after its AccumulateGrad node (as DDP's autograd_hook), so that a gradient aliasing
    // the bucket is complete there and needs no copy.
    for (size_t k = 0; k < d.params.size() && overlap; ++k)
        if (!isSparse(k)) {
            auto accumulator = torch::autograd::impl::grad_accumulator(d.params[k]);
            if (!accumulator)
                throw ConfigError("data-parallel training needs parameters that require gradients");
            const auto key =
                accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
                    [impl = m_impl.get(), k](const torch::autograd::variable_list& outputs,
                                             const torch::autograd::variable_list&) {
                        impl->onGrad(k);
                        return outputs;
                    }));
            d.hooks.emplace_back(std::move(accumulator), key);
        }
}

Reducer::~Reducer() {
    // The parameters outlive the reducer: their accumulators must not call into it any more.
    for (auto& [accumulator, key] : m_impl->hooks) accumulator->del_post_hook(key);
}

void Reducer::prepare(int64_t step) {
    auto& d = *m_impl;
    std::lock_guard<std::mutex> lk(d.mutex);
    d.step = step;
    {
        std::lock_guard<std::mutex> c(d.commMutex);
        d.commDone = 0;
        d.commSent = 0;
        d.commError = nullptr;
    }
    for (auto& b : d.buckets) {
        b.pending = b.params.size();
        b.ready.assign(b.params.size(), 0);
        b.launched = false;
        b.work.reset();
    }
    d.nextToLaunch = 0;
    d.anyLaunched = false;
    // Last step's averaged (dense) gradient is gone, so backward leaves a sparse one again
    // rather than adding its rows into a dense tensor.
    for (size_t k : d.sparse) d.params[k].mutable_grad() = torch::Tensor();
}

void Reducer::rescaleResiduals(double factor) {
    auto& d = *m_impl;
    std::lock_guard<std::mutex> lk(d.mutex);
    torch::NoGradGuard noGrad;
    for (auto& b : d.buckets)
        for (auto* t : {&b.residual, &b.shardResidual})
            if (t->defined()) t->mul_(factor);
}

std::map<std::string, torch::Tensor> Reducer::gatherResiduals() {
    auto& d = *m_impl;
    std::lock_guard<std::mutex> lk(d.mutex);
    std::map<std::string, torch::Tensor> out;
    if (!d.compress.errorFeedback) return out;
    const int world = d.ctx->worldSize();
    auto& pg = *d.ctx->impl().pg;
    // Ranks need not hold the same residuals (in the hierarchical exchange only the hosts'
    // leaders compress between hosts), so the sizes go first: then every rank takes part in the
    // same gathers, a rank without a residual sending zeros that are not kept.
    const size_t slots = d.buckets.size() * 2;
    auto residualOf = [&](size_t slot) -> const torch::Tensor& {
        const auto& b = d.buckets[slot / 2];
        return slot % 2 ? b.shardResidual : b.residual;
    };
    auto mySizes = torch::zeros({static_cast<int64_t>(slots)}, torch::kLong);
    for (size_t k = 0; k < slots; ++k)
        if (residualOf(k).defined()) mySizes[static_cast<int64_t>(k)] = residualOf(k).numel();
    std::vector<std::vector<at::Tensor>> sizes(1);
    for (int j = 0; j < world; ++j) sizes[0].push_back(torch::empty_like(mySizes).to(d.ctx->commDevice()));
    std::vector<at::Tensor> sizeIn{mySizes.to(d.ctx->commDevice())};
    pg.allgather(sizes, sizeIn)->wait();
    std::vector<torch::Tensor> all;  // [world] per slot, on the CPU
    for (auto& t : sizes[0]) all.push_back(t.cpu());
    for (size_t k = 0; k < slots; ++k) {
        int64_t most = 0;
        for (const auto& t : all) most = std::max(most, t[static_cast<int64_t>(k)].item<int64_t>());
        if (most == 0) continue;
        auto mine =
            torch::zeros({most}, torch::TensorOptions().dtype(torch::kFloat).device(d.ctx->commDevice()));
        if (residualOf(k).defined())
            mine.narrow(0, 0, residualOf(k).numel()).copy_(residualOf(k).reshape({-1}));
        std::vector<std::vector<at::Tensor>> gathered(1);
        for (int j = 0; j < world; ++j) gathered[0].push_back(torch::empty_like(mine));
        std::vector<at::Tensor> input{mine};
        pg.allgather(gathered, input)->wait();
        for (int j = 0; j < world; ++j) {
            const int64_t n = all[static_cast<size_t>(j)][static_cast<int64_t>(k)].item<int64_t>();
            if (n > 0)
                out[Impl::residualName(j, k / 2, k % 2 == 1)] =
                    gathered[0][static_cast<size_t>(j)].narrow(0, 0, n).cpu();
        }
    }
    return out;
}

void Reducer::restoreResiduals(const std::map<std::string, torch::Tensor>& extras) {
    auto& d = *m_impl;
    std::lock_guard<std::mutex> lk(d.mutex);
    const std::string prefix = residualPrefix(d.ctx->rank());
    for (const auto& [name, t] : extras)
        if (name.rfind(prefix, 0) == 0) d.pendingResiduals[name] = t.to(d.ctx->commDevice(), torch::kFloat);
}

std::string Reducer::strategy() const { return m_impl->strategy->describe(); }

std::string Reducer::residualPrefix(int rank) { return "ef.r" + std::to_string(rank) + ".b"; }

Reducer::Stats Reducer::finish() {
    auto& d = *m_impl;
    const auto backwardEnd = Clock::now();
    Stats s;
    if (!d.overlap)  // the accumulated gradients, in bucket order (reverse registration)
        for (size_t k = d.params.size(); k-- > 0;)
            if (d.params[k].grad().defined() &&
                std::find(d.sparse.begin(), d.sparse.end(), k) == d.sparse.end())
                d.onGrad(k);
    {
        std::lock_guard<std::mutex> lk(d.mutex);
        // A parameter that took no part in this step's graph: contribute zeros, so that the
        // collectives still match across ranks.
        for (auto& b : d.buckets)
            if (b.pending > 0 && !b.launched) {
                // zero_grad() keeps .grad defined, so "no gradient this step" is the ready flag.
                for (size_t slot = 0; slot < b.params.size(); ++slot)
                    if (!b.ready[slot])
                        b.buffer.narrow(0, b.offsets[slot], d.params[b.params[slot]].numel()).zero_();
                b.pending = 0;
            }
        d.launchReady();
    }
    const int n = d.ctx->worldSize();
    int64_t payload = 0, sent = 0;
    const bool ring = d.strategy->asynchronous();
    if (!ring) {
        // Wait for the communication thread to finish every bucket.
        std::unique_lock<std::mutex> lk(d.commMutex);
        d.commCv.wait(lk, [&] { return d.commDone == d.buckets.size(); });
        if (d.commError) std::rethrow_exception(d.commError);
        sent = d.commSent;
    }
    for (size_t bi = 0; bi < d.buckets.size(); ++bi) {
        auto& b = d.buckets[bi];
        if (ring) b.work->wait();
        payload += b.buffer.numel() * 4;
        for (size_t slot = 0; slot < b.params.size(); ++slot) {
            const size_t k = b.params[slot];
            auto& p = d.params[k];
            if (d.isBucketView(k, p.grad())) continue;  // averaged in place
            if (auto alias = d.gradFor(k); alias.defined()) {
                // From now on backward adds into the bucket (this step's gradient was copied in).
                p.mutable_grad() = std::move(alias);
                continue;
            }
            auto avg = b.buffer.narrow(0, b.offsets[slot], p.numel()).view_as(p);
            if (p.grad().defined())
                p.mutable_grad().copy_(avg);
            else
                p.mutable_grad() = avg.to(p.device(), p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
        }
    }
    // Sparse parameters after the buckets, in the same order on every rank (a ps strategy's
    // servers continue the buckets' round robin).
    for (size_t j = 0; j < d.sparse.size(); ++j) {
        auto& p = d.params[d.sparse[j]];
        if (!d.anyLaunched) {
            d.firstLaunch = Clock::now();
            d.anyLaunched = true;
        }
        sent += d.strategy->exchangeSparse(p, d.buckets.size() + j);
        payload += p.numel() * 4;
    }
    const auto end = Clock::now();
    s.commMs = std::chrono::duration<double, std::milli>(end - d.firstLaunch).count();
    s.exposedMs =
        std::chrono::duration<double, std::milli>(end - std::max(backwardEnd, d.firstLaunch)).count();
    const int64_t ringBytes = payload * 2 * (n - 1) / n;
    s.bytesSent = ring ? ringBytes : sent;
    s.compressionRatio = (!d.codec->compressed() && d.sparse.empty()) || s.bytesSent == 0
                             ? 1.0
                             : static_cast<double>(ringBytes) / static_cast<double>(s.bytesSent);
    s.buckets = static_cast<int>(d.buckets.size());
    return s;
}

}  // namespace lathe::core
