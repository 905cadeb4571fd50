// What the exchange strategies share: the compressed all-reduce, and the table of strategies by
// name (exchange.h).
#include "distributed/exchange.h"

#include "distributed/process_group_impl.h"

#include <stdexcept>

#include "lathe/core/error.h"

namespace lathe::core {

c10::intrusive_ptr<c10d::Work> ExchangeStrategy::launch(Bucket&) {
    throw std::logic_error(std::string("the ") + name() + " exchange has no asynchronous launch");
}

int64_t ExchangeStrategy::exchangeSparse(torch::Tensor&, size_t) {
    throw std::logic_error(std::string("the ") + name() + " exchange takes no sparse gradients");
}

int64_t ExchangeStrategy::compressedAllReduce(Bucket& b, size_t bucketIndex, int64_t step, bool betweenHosts,
                                              bool average) {
    const Codec& c = codec();
    CommGroup& pg = betweenHosts ? *ctx().impl().leaders : *ctx().impl().pg;
    const int rph = betweenHosts ? ctx().ranksPerHost() : 1;
    const int rank = ctx().rank() / rph, world = ctx().worldSize() / rph;
    const int64_t n = b.buffer.numel();
    if (!b.padded.defined()) {
        const int64_t unit = 8;  // int4 shards stay whole bytes and each message's scales 4-byte aligned
        b.shard = ((n + world - 1) / world + unit - 1) / unit * unit;
        b.padded = torch::zeros({b.shard * world}, c.floats());
        if (c.errorFeedback()) {
            b.residual = torch::zeros({b.shard * world}, c.floats());
            b.shardResidual = torch::zeros({b.shard}, c.floats());
            if (m_env.residualsAllocated) m_env.residualsAllocated(bucketIndex, b);
        }
    }
    b.padded.narrow(0, 0, n).copy_(b.buffer);
    if (b.padded.numel() > n)
        b.padded.narrow(0, n, b.padded.numel() - n).zero_();  // last step's decoded tail
    const int64_t msg = c.messageBytes(b.shard);
    auto send = torch::empty({msg * world}, c.bytes());
    auto recv = torch::empty({msg * world}, c.bytes());
    const uint64_t seed = c.seed(step, bucketIndex, rank);
    float* x = b.padded.data_ptr<float>();
    float* res = c.errorFeedback() ? b.residual.data_ptr<float>() : nullptr;
    for (int j = 0; j < world; ++j)
        c.encode(x + j * b.shard, res ? res + j * b.shard : nullptr, b.shard,
                 send.data_ptr<uint8_t>() + j * msg, seed, static_cast<uint64_t>(j * b.shard));
    std::vector<int64_t> equal;
    pg.alltoall_base(recv, send, equal, equal)->wait();
    // Rank `rank` owns shard `rank`: the sum of every rank's version, in FP32.
    auto acc = torch::zeros({b.shard}, c.floats());
    for (int j = 0; j < world; ++j)
        c.decode(recv.data_ptr<uint8_t>() + j * msg, b.shard, acc.data_ptr<float>(), true);
    if (average) acc.div_(world);
    auto mine = torch::empty({msg}, c.bytes());
    c.encode(acc.data_ptr<float>(), c.errorFeedback() ? b.shardResidual.data_ptr<float>() : nullptr, b.shard,
             mine.data_ptr<uint8_t>(), seed ^ 0xA5A5A5A5ull, static_cast<uint64_t>(rank * b.shard));
    std::vector<std::vector<at::Tensor>> gathered(1);
    for (int j = 0; j < world; ++j) gathered[0].push_back(torch::empty({msg}, c.bytes()));
    std::vector<at::Tensor> input{mine};
    pg.allgather(gathered, input)->wait();
    for (int j = 0; j < world; ++j)
        c.decode(gathered[0][static_cast<size_t>(j)].data_ptr<uint8_t>(), b.shard, x + j * b.shard, false);
    b.buffer.copy_(b.padded.narrow(0, 0, n));
    return 2 * (world - 1) * msg;
}

const std::vector<ExchangeStrategyInfo>& exchangeStrategies() {
    static const std::vector<ExchangeStrategyInfo> table = {
        {"ring", "all-reduce over every rank", &makeRingExchange},
        {"hierarchical", "reduce within each host, all-reduce between hosts, broadcast back",
         &makeHierarchicalExchange},
        {"ps", "each bucket reduced on a server rank and sent back; sparse rows alone",
         &makeParameterServerExchange},
    };
    return table;
}

std::unique_ptr<ExchangeStrategy> makeExchangeStrategy(const std::string& name, ExchangeEnv env) {
    std::string names;
    for (const auto& s : exchangeStrategies()) {
        if (name == s.name) return s.make(std::move(env));
        names += (names.empty() ? "" : ", ") + std::string(s.name);
    }
    throw ConfigError("`strategy` must be one of " + names + " (got '" + name + "')");
}

}  // namespace lathe::core
