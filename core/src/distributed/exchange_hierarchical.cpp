// Hierarchical: reduce within the host to its leader, all-reduce among the hosts' leaders,
// broadcast within the host. With compression only the leaders' exchange (between hosts, the
// slow links) is compressed; within a host gradients travel in FP32.
#include "distributed/exchange.h"

#include "distributed/process_group_impl.h"

namespace lathe::core {
namespace {

class HierarchicalExchange final : public ExchangeStrategy {
public:
    using ExchangeStrategy::ExchangeStrategy;
    const char* name() const override { return "hierarchical"; }
    std::string describe() const override {
        return std::string(name()) + " (" + std::to_string(ctx().ranksPerHost()) + " ranks per host)";
    }

    int64_t exchange(Bucket& b, size_t bucketIndex, int64_t step) override {
        auto& g = ctx().impl();
        const int rph = ctx().ranksPerHost(), world = ctx().worldSize();
        const int64_t bytes = b.buffer.numel() * 4;
        b.buffer.div_(world);
        std::vector<at::Tensor> one{b.buffer};
        c10d::ReduceOptions ro;
        ro.rootRank = 0;
        g.host->reduce(one, ro)->wait();
        int64_t sent = ctx().rank() % rph == 0 ? 0 : bytes;
        if (g.leaders) {
            const int hosts = world / rph;
            if (codec().compressed())
                sent += compressedAllReduce(b, bucketIndex, step, /*betweenHosts=*/true, /*average=*/false);
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
};

}  // namespace

std::unique_ptr<ExchangeStrategy> makeHierarchicalExchange(ExchangeEnv env) {
    return std::make_unique<HierarchicalExchange>(std::move(env));
}

}  // namespace lathe::core
