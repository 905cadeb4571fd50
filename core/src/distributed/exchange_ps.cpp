// Parameter server: bucket k is pushed to (reduced on) server rank k mod ps_ranks, which
// aggregates it; every rank pulls the aggregate back and applies the same update. Compressed,
// the pushes and the reply are compressed messages (error feedback on both sides). Parameters with
// sparse gradients (embedding tables) send only their touched rows.
#include "distributed/exchange.h"

#include "distributed/process_group_impl.h"

namespace lathe::core {
namespace {

class ParameterServerExchange final : public ExchangeStrategy {
public:
    using ExchangeStrategy::ExchangeStrategy;
    const char* name() const override { return "ps"; }
    std::string describe() const override {
        const int n = m_env.options.psRanks;
        return std::string(name()) + " (" + std::to_string(n) + (n == 1 ? " server rank)" : " server ranks)");
    }
    bool takesSparse() const override { return true; }

    // Parameter-server style: bucket k is pushed to (reduced on) server rank k mod ps_ranks, which
    // aggregates it; every rank pulls the aggregate back and applies the same update.
    int64_t exchange(Bucket& b, size_t bucketIndex, int64_t step) override {
        auto& pg = ctx().impl().pg;
        const int world = ctx().worldSize();
        const int server = serverOf(bucketIndex);
        if (codec().compressed()) return exchangeCompressed(b, bucketIndex, step, server);
        const int64_t bytes = b.buffer.numel() * 4;
        b.buffer.div_(world);
        std::vector<at::Tensor> one{b.buffer};
        c10d::ReduceOptions ro;
        ro.rootRank = server;
        pg->reduce(one, ro)->wait();
        c10d::BroadcastOptions bo;
        bo.rootRank = server;
        pg->broadcast(one, bo)->wait();
        return ctx().rank() == server ? bytes * (world - 1) : bytes;
    }

    // Compressed push and pull: every rank pushes its (error-fed) compressed gradient to the
    // server, which decodes and sums them in FP32, averages, compresses the result (with its own
    // error feedback) and sends it back to every rank.
    int64_t exchangeCompressed(Bucket& b, size_t bucketIndex, int64_t step, int server) {
        const Codec& c = codec();
        auto& pg = ctx().impl().pg;
        const int world = ctx().worldSize(), rank = ctx().rank();
        const int64_t n = b.buffer.numel();
        if (!b.padded.defined()) {
            b.shard = (n + 7) / 8 * 8;  // whole int4 bytes, 4-byte aligned scales
            b.padded = torch::zeros({b.shard}, c.floats());
            if (c.errorFeedback()) {
                b.residual = torch::zeros({b.shard}, c.floats());
                b.shardResidual = torch::zeros({b.shard}, c.floats());
                if (m_env.residualsAllocated) m_env.residualsAllocated(bucketIndex, b);
            }
        }
        b.padded.narrow(0, 0, n).copy_(b.buffer);
        const int64_t msg = c.messageBytes(b.shard);
        const uint64_t seed = c.seed(step, bucketIndex, rank);
        auto mine = torch::empty({msg}, c.bytes());
        c.encode(b.padded.data_ptr<float>(), c.errorFeedback() ? b.residual.data_ptr<float>() : nullptr,
                 b.shard, mine.data_ptr<uint8_t>(), seed, 0);
        std::vector<std::vector<at::Tensor>> pushed;
        if (rank == server) {
            pushed.emplace_back();
            for (int j = 0; j < world; ++j) pushed[0].push_back(torch::empty({msg}, c.bytes()));
        }
        std::vector<at::Tensor> input{mine};
        c10d::GatherOptions go;
        go.rootRank = server;
        pg->gather(pushed, input, go)->wait();
        auto reply = torch::empty({msg}, c.bytes());
        if (rank == server) {
            auto acc = torch::zeros({b.shard}, c.floats());
            for (int j = 0; j < world; ++j)
                c.decode(pushed[0][static_cast<size_t>(j)].data_ptr<uint8_t>(), b.shard,
                         acc.data_ptr<float>(), true);
            acc.div_(world);
            c.encode(acc.data_ptr<float>(), c.errorFeedback() ? b.shardResidual.data_ptr<float>() : nullptr,
                     b.shard, reply.data_ptr<uint8_t>(), seed ^ 0xA5A5A5A5ull, 0);
        }
        std::vector<at::Tensor> one{reply};
        c10d::BroadcastOptions bo;
        bo.rootRank = server;
        pg->broadcast(one, bo)->wait();
        c.decode(reply.data_ptr<uint8_t>(), b.shard, b.padded.data_ptr<float>(), false);
        b.buffer.copy_(b.padded.narrow(0, 0, n));
        return rank == server ? msg * (world - 1) : msg;
    }

    // Touched rows only: counts are all-gathered so the pushes can be padded to one size, the
    // server sums every rank's rows in FP32 and broadcasts the averaged union of touched rows.
    // Returns the bytes this rank sent; writes the averaged (dense) gradient into p.grad.
    int64_t exchangeSparse(torch::Tensor& p, size_t index) override {
        const Codec& c = codec();
        const int server = serverOf(index);
        auto& pg = ctx().impl().pg;
        const int world = ctx().worldSize(), rank = ctx().rank();
        const int64_t rows = p.size(0), dim = p.numel() / std::max<int64_t>(1, p.size(0));
        torch::Tensor idx = torch::empty({0}, c.longs()), vals = torch::empty({0, dim}, c.floats());
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
            idx = idx.to(ctx().commDevice());
            vals = vals.to(ctx().commDevice());
        }
        // 1. how many rows each rank pushes
        std::vector<std::vector<at::Tensor>> counts(1);
        for (int j = 0; j < world; ++j) counts[0].push_back(torch::empty({1}, c.longs()));
        std::vector<at::Tensor> myCount{torch::full({1}, idx.numel(), c.longs())};
        pg->allgather(counts, myCount)->wait();
        int64_t maxRows = 0;
        for (const auto& c : counts[0]) maxRows = std::max(maxRows, c.item<int64_t>());
        // 2. push (row, value) pairs, padded with zero rows to the largest count
        auto padIdx = torch::zeros({maxRows}, c.longs());
        auto padVals = torch::zeros({maxRows, dim}, c.floats());
        if (idx.numel() > 0) {
            padIdx.narrow(0, 0, idx.numel()).copy_(idx);
            padVals.narrow(0, 0, idx.numel()).copy_(vals);
        }
        std::vector<std::vector<at::Tensor>> gotIdx, gotVals;
        if (rank == server) {
            gotIdx.emplace_back();
            gotVals.emplace_back();
            for (int j = 0; j < world; ++j) {
                gotIdx[0].push_back(torch::empty({maxRows}, c.longs()));
                gotVals[0].push_back(torch::empty({maxRows, dim}, c.floats()));
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
        auto outCount = torch::zeros({1}, c.longs());
        if (rank == server) {
            auto acc = torch::zeros({rows, dim}, c.floats());
            std::vector<torch::Tensor> touched;
            for (int j = 0; j < world; ++j) {
                const auto n = counts[0][static_cast<size_t>(j)].item<int64_t>();
                if (n == 0) continue;
                auto ji = gotIdx[0][static_cast<size_t>(j)].narrow(0, 0, n);
                acc.index_add_(0, ji, gotVals[0][static_cast<size_t>(j)].narrow(0, 0, n));
                touched.push_back(ji);
            }
            outIdx = touched.empty() ? torch::empty({0}, c.longs())
                                     : std::get<0>(at::_unique(torch::cat(touched)));
            outVals = acc.index_select(0, outIdx).div_(world).contiguous();
            outCount.fill_(outIdx.numel());
        }
        c10d::BroadcastOptions bo;
        bo.rootRank = server;
        std::vector<at::Tensor> countT{outCount};
        pg->broadcast(countT, bo)->wait();
        const auto n = outCount.item<int64_t>();
        if (rank != server) {
            outIdx = torch::empty({n}, c.longs());
            outVals = torch::empty({n, dim}, c.floats());
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

private:
    // Exchanges take servers round robin, in the same order on every rank.
    int serverOf(size_t index) const {
        return static_cast<int>(index % static_cast<size_t>(std::max(1, m_env.options.psRanks)));
    }
};

}  // namespace

std::unique_ptr<ExchangeStrategy> makeParameterServerExchange(ExchangeEnv env) {
    return std::make_unique<ParameterServerExchange>(std::move(env));
}

}  // namespace lathe::core
