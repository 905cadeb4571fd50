// Gradient averaging across ranks: buckets, overlap with backward, and the exchange strategies
// (ring, hierarchical, parameter server) with optional compression and error feedback.
#include "distributed/reducer.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "distributed/process_group_impl.h"
#include "lathe/core/error.h"
#include "lathe/kernels/compress.h"
#include "lathe/kernels/cuda_device.h"

namespace lathe::core {

using Clock = std::chrono::steady_clock;

namespace kc = lathe::kernels;

struct Reducer::Impl {
    DistContext* ctx = nullptr;
    CompressOptions compress;
    kc::CompressFormat format = kc::CompressFormat::None;
    std::vector<torch::Tensor> params;
    struct Bucket {
        std::vector<size_t> params;    // indices into `params`
        std::vector<int64_t> offsets;  // element offset of each in `buffer`
        torch::Tensor buffer;
        size_t pending = 0;
        std::vector<char> ready;  // per slot: its gradient arrived this step
        bool launched = false;
        c10::intrusive_ptr<c10d::Work> work;
        // Compression state, kept across steps: the padded working copy and the error-feedback
        // residuals of this rank's contribution and of the shard it reduces.
        torch::Tensor padded, residual, shardResidual;
        int64_t shard = 0;  // elements per rank's shard (a multiple of the chunk)
    };
    std::vector<Bucket> buckets;
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
        if (onGpu()) kc::cuda::setDevice(ctx->commDevice().index());
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
                auto& b = buckets[bi];
                if (compress.strategy == "hierarchical")
                    sent = exchangeHierarchical(b, bi, step);
                else if (compress.strategy == "ps")
                    sent = exchangePs(b, bi, step);
                else
                    sent = exchangeCompressed(b, bi, step);
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

    bool plainRing() const { return format == kc::CompressFormat::None && compress.strategy == "ring"; }

    // Exchange buffers live where the collectives take them (the CPU for Gloo, the GPU for NCCL),
    // and the compression kernels run there: kernels/' CUDA versions on the GPU.
    torch::TensorOptions fopt() const {
        return torch::TensorOptions().dtype(torch::kFloat).device(ctx->commDevice());
    }
    torch::TensorOptions bopt() const {
        return torch::TensorOptions().dtype(torch::kUInt8).device(ctx->commDevice());
    }
    torch::TensorOptions lopt() const {
        return torch::TensorOptions().dtype(torch::kLong).device(ctx->commDevice());
    }
    bool onGpu() const { return ctx->commDevice().is_cuda(); }

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
            if (!plainRing()) {
                {
                    std::lock_guard<std::mutex> lk(commMutex);
                    commQueue.push_back(bi);
                }
                commCv.notify_one();
                continue;
            }
            b.buffer.div_(ctx->worldSize());
            std::vector<at::Tensor> one{b.buffer};
            b.work = ctx->impl().pg->allreduce(one);
        }
    }

    int64_t messageBytes(int64_t n) const {
        return static_cast<int64_t>(
            kc::compressedBytes(static_cast<size_t>(n), static_cast<size_t>(compress.chunk), format));
    }

    // x (n floats) -> message bytes; with error feedback the residual takes the error.
    void encode(const float* x, float* residual, int64_t n, uint8_t* msg, uint64_t seed, uint64_t offset) {
        const auto un = static_cast<size_t>(n);
        kc::QuantizeParams q;
        q.chunk = static_cast<size_t>(compress.chunk);
        q.stochastic = compress.stochastic;
        q.seed = seed;
        q.indexOffset = offset;
        auto* scales = reinterpret_cast<float*>(msg + kc::codeBytes(un, format));
        if (onGpu()) {  // on the current (default) stream, which NCCL's stream waits for
            switch (format) {
                case kc::CompressFormat::Int8:
                    kc::cuda::quantizeInt8(x, residual, un, reinterpret_cast<int8_t*>(msg), scales, q);
                    break;
                case kc::CompressFormat::Int4:
                    kc::cuda::quantizeInt4(x, residual, un, msg, scales, q);
                    break;
                case kc::CompressFormat::Fp16:
                case kc::CompressFormat::Bf16:
                    kc::cuda::floatTo16(x, residual, un, reinterpret_cast<uint16_t*>(msg),
                                        format == kc::CompressFormat::Bf16);
                    break;
                case kc::CompressFormat::None:
                    break;
            }
            return;
        }
        switch (format) {
            case kc::CompressFormat::Int8:
                if (residual)
                    kc::quantizeInt8ErrorFeedback(x, residual, un, reinterpret_cast<int8_t*>(msg), scales, q);
                else
                    kc::quantizeInt8(x, un, reinterpret_cast<int8_t*>(msg), scales, q);
                break;
            case kc::CompressFormat::Int4:
                if (residual)
                    kc::quantizeInt4ErrorFeedback(x, residual, un, msg, scales, q);
                else
                    kc::quantizeInt4(x, un, msg, scales, q);
                break;
            case kc::CompressFormat::Fp16:
                if (residual)
                    kc::floatToHalfErrorFeedback(x, residual, un, reinterpret_cast<uint16_t*>(msg));
                else
                    kc::floatToHalf(x, un, reinterpret_cast<uint16_t*>(msg));
                break;
            case kc::CompressFormat::Bf16:
                if (residual)
                    kc::floatToBf16ErrorFeedback(x, residual, un, reinterpret_cast<uint16_t*>(msg));
                else
                    kc::floatToBf16(x, un, reinterpret_cast<uint16_t*>(msg));
                break;
            case kc::CompressFormat::None:
                break;
        }
    }

    // message -> out (add: accumulate in FP32).
    void decode(const uint8_t* msg, int64_t n, float* out, bool add) {
        const auto un = static_cast<size_t>(n);
        const auto chunk = static_cast<size_t>(compress.chunk);
        const auto* scales = reinterpret_cast<const float*>(msg + kc::codeBytes(un, format));
        if (onGpu()) {
            switch (format) {
                case kc::CompressFormat::Int8:
                    kc::cuda::dequantizeInt8(reinterpret_cast<const int8_t*>(msg), scales, un, chunk, out,
                                             add);
                    break;
                case kc::CompressFormat::Int4:
                    kc::cuda::dequantizeInt4(msg, scales, un, chunk, out, add);
                    break;
                case kc::CompressFormat::Fp16:
                case kc::CompressFormat::Bf16:
                    kc::cuda::floatFrom16(reinterpret_cast<const uint16_t*>(msg), un, out,
                                          format == kc::CompressFormat::Bf16, add);
                    break;
                case kc::CompressFormat::None:
                    break;
            }
            return;
        }
        switch (format) {
            case kc::CompressFormat::Int8:
                if (add)
                    kc::dequantizeAddInt8(reinterpret_cast<const int8_t*>(msg), scales, un, chunk, out);
                else
                    kc::dequantizeInt8(reinterpret_cast<const int8_t*>(msg), scales, un, chunk, out);
                break;
            case kc::CompressFormat::Int4:
                if (add)
                    kc::dequantizeAddInt4(msg, scales, un, chunk, out);
                else
                    kc::dequantizeInt4(msg, scales, un, chunk, out);
                break;
            case kc::CompressFormat::Fp16:
                if (add)
                    kc::addHalfToFloat(reinterpret_cast<const uint16_t*>(msg), un, out);
                else
                    kc::halfToFloat(reinterpret_cast<const uint16_t*>(msg), un, out);
                break;
            case kc::CompressFormat::Bf16:
                if (add)
                    kc::addBf16ToFloat(reinterpret_cast<const uint16_t*>(msg), un, out);
                else
                    kc::bf16ToFloat(reinterpret_cast<const uint16_t*>(msg), un, out);
                break;
            case kc::CompressFormat::None:
                break;
        }
    }

    // Reduce-scatter + all-gather of compressed shards over `pg` (every rank, or the hosts'
    // leaders); returns the bytes this rank sent. `average`: divide the sum by the group size
    // (the hierarchical exchange has already divided by the whole world).
    int64_t exchangeCompressed(Bucket& b, size_t bucketIndex, int64_t step) {
        return exchangeCompressedOn(b, bucketIndex, step, *ctx->impl().pg, ctx->rank(), ctx->worldSize(),
                                    true);
    }

    int64_t exchangeCompressedOn(Bucket& b, size_t bucketIndex, int64_t step, CommGroup& pg, int rank,
                                 int world, bool average) {
        const int64_t n = b.buffer.numel();
        if (!b.padded.defined()) {
            const int64_t unit = 8;  // int4 shards stay whole bytes and each message's scales 4-byte aligned
            b.shard = ((n + world - 1) / world + unit - 1) / unit * unit;
            b.padded = torch::zeros({b.shard * world}, fopt());
            if (compress.errorFeedback) {
                b.residual = torch::zeros({b.shard * world}, fopt());
                b.shardResidual = torch::zeros({b.shard}, fopt());
                takePending(bucketIndex, b);
            }
        }
        b.padded.narrow(0, 0, n).copy_(b.buffer);
        if (b.padded.numel() > n)
            b.padded.narrow(0, n, b.padded.numel() - n).zero_();  // last step's decoded tail
        const int64_t msg = messageBytes(b.shard);
        auto send = torch::empty({msg * world}, bopt());
        auto recv = torch::empty({msg * world}, bopt());
        const uint64_t seed = compress.seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(step) << 20) ^
                              (static_cast<uint64_t>(bucketIndex) << 8) ^ static_cast<uint64_t>(rank);
        float* x = b.padded.data_ptr<float>();
        float* res = compress.errorFeedback ? b.residual.data_ptr<float>() : nullptr;
        for (int j = 0; j < world; ++j)
            encode(x + j * b.shard, res ? res + j * b.shard : nullptr, b.shard,
                   send.data_ptr<uint8_t>() + j * msg, seed, static_cast<uint64_t>(j * b.shard));
        std::vector<int64_t> equal;
        pg.alltoall_base(recv, send, equal, equal)->wait();
        // Rank `rank` owns shard `rank`: the sum of every rank's version, in FP32.
        auto acc = torch::zeros({b.shard}, fopt());
        for (int j = 0; j < world; ++j)
            decode(recv.data_ptr<uint8_t>() + j * msg, b.shard, acc.data_ptr<float>(), true);
        if (average) acc.div_(world);
        auto mine = torch::empty({msg}, bopt());
        encode(acc.data_ptr<float>(), compress.errorFeedback ? b.shardResidual.data_ptr<float>() : nullptr,
               b.shard, mine.data_ptr<uint8_t>(), seed ^ 0xA5A5A5A5ull,
               static_cast<uint64_t>(rank * b.shard));
        std::vector<std::vector<at::Tensor>> gathered(1);
        for (int j = 0; j < world; ++j) gathered[0].push_back(torch::empty({msg}, bopt()));
        std::vector<at::Tensor> input{mine};
        pg.allgather(gathered, input)->wait();
        for (int j = 0; j < world; ++j)
            decode(gathered[0][static_cast<size_t>(j)].data_ptr<uint8_t>(), b.shard, x + j * b.shard, false);
        b.buffer.copy_(b.padded.narrow(0, 0, n));
        return 2 * (world - 1) * msg;
    }

    // Reduce within the host to its leader, all-reduce among leaders, broadcast within the host.
    // With compression only the leaders' exchange (between hosts, the slow links) is compressed;
    // within a host gradients travel in FP32.
    int64_t exchangeHierarchical(Bucket& b, size_t bucketIndex, int64_t step) {
        auto& g = ctx->impl();
        const int rph = ctx->ranksPerHost(), world = ctx->worldSize();
        const int64_t bytes = b.buffer.numel() * 4;
        b.buffer.div_(world);
        std::vector<at::Tensor> one{b.buffer};
        c10d::ReduceOptions ro;
        ro.rootRank = 0;
        g.host->reduce(one, ro)->wait();
        int64_t sent = ctx->rank() % rph == 0 ? 0 : bytes;
        if (g.leaders) {
            const int hosts = world / rph;
            if (format != kc::CompressFormat::None)
                sent +=
                    exchangeCompressedOn(b, bucketIndex, step, *g.leaders, ctx->rank() / rph, hosts, false);
            else {
                g.leaders->allreduce(one)->wait();
                sent += bytes * 2 * (hosts - 1) / hosts;
            }
            sent += bytes * (rph - 1);
        }
        c10d::BroadcastOptions bo;
        bo.rootRank = 0;
        g.host->broadcast(one, bo)->wait();
        return sent;
    }

    // Parameter-server style: bucket k is pushed to (reduced on) server rank k mod ps_ranks, which
    // aggregates it; every rank pulls the aggregate back and applies the same update.
    int64_t exchangePs(Bucket& b, size_t bucketIndex, int64_t step) {
        auto& pg = ctx->impl().pg;
        const int world = ctx->worldSize();
        const int server = static_cast<int>(bucketIndex % static_cast<size_t>(std::max(1, compress.psRanks)));
        if (format != kc::CompressFormat::None) return exchangePsCompressed(b, bucketIndex, step, server);
        const int64_t bytes = b.buffer.numel() * 4;
        b.buffer.div_(world);
        std::vector<at::Tensor> one{b.buffer};
        c10d::ReduceOptions ro;
        ro.rootRank = server;
        pg->reduce(one, ro)->wait();
        c10d::BroadcastOptions bo;
        bo.rootRank = server;
        pg->broadcast(one, bo)->wait();
        return ctx->rank() == server ? bytes * (world - 1) : bytes;
    }

    // Compressed push and pull: every rank pushes its (error-fed) compressed gradient to the
    // server, which decodes and sums them in FP32, averages, compresses the result (with its own
    // error feedback) and sends it back to every rank.
    int64_t exchangePsCompressed(Bucket& b, size_t bucketIndex, int64_t step, int server) {
        auto& pg = ctx->impl().pg;
        const int world = ctx->worldSize(), rank = ctx->rank();
        const int64_t n = b.buffer.numel();
        if (!b.padded.defined()) {
            b.shard = (n + 7) / 8 * 8;  // whole int4 bytes, 4-byte aligned scales
            b.padded = torch::zeros({b.shard}, fopt());
            if (compress.errorFeedback) {
                b.residual = torch::zeros({b.shard}, fopt());
                b.shardResidual = torch::zeros({b.shard}, fopt());
                takePending(bucketIndex, b);
            }
        }
        b.padded.narrow(0, 0, n).copy_(b.buffer);
        const int64_t msg = messageBytes(b.shard);
        const uint64_t seed = compress.seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(step) << 20) ^
                              (static_cast<uint64_t>(bucketIndex) << 8) ^ static_cast<uint64_t>(rank);
        auto mine = torch::empty({msg}, bopt());
        encode(b.padded.data_ptr<float>(), compress.errorFeedback ? b.residual.data_ptr<float>() : nullptr,
               b.shard, mine.data_ptr<uint8_t>(), seed, 0);
        std::vector<std::vector<at::Tensor>> pushed;
        if (rank == server) {
            pushed.emplace_back();
            for (int j = 0; j < world; ++j) pushed[0].push_back(torch::empty({msg}, bopt()));
        }
        std::vector<at::Tensor> input{mine};
        c10d::GatherOptions go;
        go.rootRank = server;
        pg->gather(pushed, input, go)->wait();
        auto reply = torch::empty({msg}, bopt());
        if (rank == server) {
            auto acc = torch::zeros({b.shard}, fopt());
            for (int j = 0; j < world; ++j)
                decode(pushed[0][static_cast<size_t>(j)].data_ptr<uint8_t>(), b.shard, acc.data_ptr<float>(),
                       true);
            acc.div_(world);
            encode(acc.data_ptr<float>(),
                   compress.errorFeedback ? b.shardResidual.data_ptr<float>() : nullptr, b.shard,
                   reply.data_ptr<uint8_t>(), seed ^ 0xA5A5A5A5ull, 0);
        }
        std::vector<at::Tensor> one{reply};
        c10d::BroadcastOptions bo;
        bo.rootRank = server;
        pg->broadcast(one, bo)->wait();
        decode(reply.data_ptr<uint8_t>(), b.shard, b.padded.data_ptr<float>(), false);
        b.buffer.copy_(b.padded.narrow(0, 0, n));
        return rank == server ? msg * (world - 1) : msg;
    }

    // Touched rows only: counts are all-gathered so the pushes can be padded to one size, the
    // server sums every rank's rows in FP32 and broadcasts the averaged union of touched rows.
    // Returns the bytes this rank sent; writes the averaged (dense) gradient into p.grad.
    int64_t exchangeSparse(torch::Tensor& p, int server) {
        auto& pg = ctx->impl().pg;
        const int world = ctx->worldSize(), rank = ctx->rank();
        const int64_t rows = p.size(0), dim = p.numel() / std::max<int64_t>(1, p.size(0));
        torch::Tensor idx = torch::empty({0}, lopt()), vals = torch::empty({0, dim}, fopt());
        if (p.grad().defined()) {
            auto g = p.grad();
            if (g.is_sparse()) {
                g = g.coalesce();
                idx = g.indices()[0].contiguous();
                vals = g.values().reshape({-1, dim}).to(torch::kFloat).contiguous();
            } else {  // a dense gradient (e.g. zero_grad left one): send its non-zero rows
                auto dense = g.reshape({rows, dim});
                idx = dense.abs().sum(1).nonzero().reshape({-1});
                vals = dense.index_select(0, idx).to(torch::kFloat).contiguous();
            }
            idx = idx.to(ctx->commDevice());
            vals = vals.to(ctx->commDevice());
        }
        // 1. how many rows each rank pushes
        std::vector<std::vector<at::Tensor>> counts(1);
        for (int j = 0; j < world; ++j) counts[0].push_back(torch::empty({1}, lopt()));
        std::vector<at::Tensor> myCount{torch::full({1}, idx.numel(), lopt())};
        pg->allgather(counts, myCount)->wait();
        int64_t maxRows = 0;
        for (const auto& c : counts[0]) maxRows = std::max(maxRows, c.item<int64_t>());
        // 2. push (row, value) pairs, padded with zero rows to the largest count
        auto padIdx = torch::zeros({maxRows}, lopt());
        auto padVals = torch::zeros({maxRows, dim}, fopt());
        if (idx.numel() > 0) {
            padIdx.narrow(0, 0, idx.numel()).copy_(idx);
            padVals.narrow(0, 0, idx.numel()).copy_(vals);
        }
        std::vector<std::vector<at::Tensor>> gotIdx, gotVals;
        if (rank == server) {
            gotIdx.emplace_back();
            gotVals.emplace_back();
            for (int j = 0; j < world; ++j) {
                gotIdx[0].push_back(torch::empty({maxRows}, lopt()));
                gotVals[0].push_back(torch::empty({maxRows, dim}, fopt()));
            }
        }
        c10d::GatherOptions go;
        go.rootRank = server;
        std::vector<at::Tensor> inIdx{padIdx}, inVals{padVals};
        pg->gather(gotIdx, inIdx, go)->wait();
        pg->gather(gotVals, inVals, go)->wait();
        int64_t sent = rank == server ? 0 : 8 * world + maxRows * (8 + 4 * dim);
        // 3. the server sums in FP32 and answers with the averaged union of touched rows
        torch::Tensor outIdx, outVals;
        auto outCount = torch::zeros({1}, lopt());
        if (rank == server) {
            auto acc = torch::zeros({rows, dim}, fopt());
            std::vector<torch::Tensor> touched;
            for (int j = 0; j < world; ++j) {
                const auto n = counts[0][static_cast<size_t>(j)].item<int64_t>();
                if (n == 0) continue;
                auto ji = gotIdx[0][static_cast<size_t>(j)].narrow(0, 0, n);
                acc.index_add_(0, ji, gotVals[0][static_cast<size_t>(j)].narrow(0, 0, n));
                touched.push_back(ji);
            }
            outIdx =
                touched.empty() ? torch::empty({0}, lopt()) : std::get<0>(at::_unique(torch::cat(touched)));
            outVals = acc.index_select(0, outIdx).div_(world).contiguous();
            outCount.fill_(outIdx.numel());
        }
        c10d::BroadcastOptions bo;
        bo.rootRank = server;
        std::vector<at::Tensor> countT{outCount};
        pg->broadcast(countT, bo)->wait();
        const auto n = outCount.item<int64_t>();
        if (rank != server) {
            outIdx = torch::empty({n}, lopt());
            outVals = torch::empty({n, dim}, fopt());
        }
        if (n > 0) {
            std::vector<at::Tensor> bi{outIdx}, bv{outVals};
            pg->broadcast(bi, bo)->wait();
            pg->broadcast(bv, bo)->wait();
        }
        if (rank == server) sent += (world - 1) * (8 + n * (8 + 4 * dim));
        // The optimizers here take dense gradients: the averaged rows go into a dense one.
        // Allocated in p's shape (not a reshaped view: zero_grad() detaches gradients in place).
        auto dense = torch::zeros(p.sizes(), p.options());
        if (n > 0)
            dense.view({rows, dim})
                .index_copy_(0, outIdx.to(p.device()), outVals.to(p.device(), p.scalar_type()));
        p.mutable_grad() = dense;
        return sent;
    }

    void onGrad(size_t index, const torch::Tensor& grad) {
        std::lock_guard<std::mutex> lk(mutex);
        const auto [bi, slot] = where[index];
        auto& b = buckets[bi];
        const auto n = params[index].numel();
        b.buffer.narrow(0, b.offsets[slot], n).copy_(grad.reshape({-1}));
        if (!b.ready[slot]) {
            b.ready[slot] = 1;
            if (b.pending > 0) --b.pending;
        }
        launchReady();
    }
};

Reducer::Reducer(DistContext& ctx, std::vector<torch::Tensor> params, double bucketMb,
                 CompressOptions compress, std::vector<size_t> sparse)
    : m_impl(std::make_unique<Impl>()) {
    auto& d = *m_impl;
    d.ctx = &ctx;
    d.compress = compress;
    const auto format = kc::parseCompressFormat(compress.format);
    if (!format)
        throw ConfigError("`compress` must be none, fp16, bf16, int8 or int4 (got '" + compress.format +
                          "')");
    d.format = *format;
    if (d.onGpu() && d.format != kc::CompressFormat::None && !kc::cudaCompiled())
        throw ConfigError("`compress` " + compress.format +
                          " on NCCL needs Lathe's CUDA kernels, and this build has "
                          "none (configure with the CUDA toolkit, LATHE_CUDA=ON); or use backend = \"gloo\"");
    d.params = std::move(params);
    if (!sparse.empty() && compress.strategy != "ps")
        throw ConfigError("sparse embedding gradients are exchanged by the ps strategy only");
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
    if (!d.plainRing()) d.commThread = std::thread([impl = m_impl.get()] { impl->commLoop(); });
    for (size_t k = 0; k < d.params.size(); ++k)
        if (!isSparse(k))
            d.params[k].register_hook(
                [impl = m_impl.get(), k](const torch::Tensor& grad) { impl->onGrad(k, grad); });
}

Reducer::~Reducer() = default;

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

std::string Reducer::residualPrefix(int rank) { return "ef.r" + std::to_string(rank) + ".b"; }

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
    const bool ring = d.plainRing();
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
            auto& p = d.params[b.params[slot]];
            auto avg = b.buffer.narrow(0, b.offsets[slot], p.numel()).view_as(p);
            if (p.grad().defined())
                p.mutable_grad().copy_(avg);
            else
                p.mutable_grad() = avg.to(p.device(), p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
        }
    }
    // Sparse parameters after the buckets, in the same order on every rank; their servers follow
    // the buckets' round robin.
    for (size_t j = 0; j < d.sparse.size(); ++j) {
        auto& p = d.params[d.sparse[j]];
        const int server =
            static_cast<int>((d.buckets.size() + j) % static_cast<size_t>(std::max(1, d.compress.psRanks)));
        if (!d.anyLaunched) {
            d.firstLaunch = Clock::now();
            d.anyLaunched = true;
        }
        sent += d.exchangeSparse(p, server);
        payload += p.numel() * 4;
    }
    const auto end = Clock::now();
    s.commMs = std::chrono::duration<double, std::milli>(end - d.firstLaunch).count();
    s.exposedMs =
        std::chrono::duration<double, std::milli>(end - std::max(backwardEnd, d.firstLaunch)).count();
    const int64_t ringBytes = payload * 2 * (n - 1) / n;
    s.bytesSent = ring ? ringBytes : sent;
    s.compressionRatio = (d.format == kc::CompressFormat::None && d.sparse.empty()) || s.bytesSent == 0
                             ? 1.0
                             : static_cast<double>(ringBytes) / static_cast<double>(s.bytesSent);
    s.buckets = static_cast<int>(d.buckets.size());
    return s;
}

}  // namespace lathe::core
