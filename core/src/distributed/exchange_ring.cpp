// The ring: every rank's gradients averaged over every rank. Uncompressed, one asynchronous
// all-reduce per bucket launched from the backward hooks (c10d's ring or NCCL's); compressed, a
// reduce-scatter and an all-gather of compressed shards on the communication thread.
#include "distributed/exchange.h"

#include "distributed/process_group_impl.h"

namespace lathe::core {
namespace {

class RingExchange final : public ExchangeStrategy {
public:
    using ExchangeStrategy::ExchangeStrategy;
    const char* name() const override { return "ring"; }
    bool asynchronous() const override { return !codec().compressed(); }

    c10::intrusive_ptr<c10d::Work> launch(Bucket& b) override {
        b.buffer.div_(ctx().worldSize());
        std::vector<at::Tensor> one{b.buffer};
        return ctx().impl().pg->allreduce(one);
    }

    int64_t exchange(Bucket& b, size_t bucketIndex, int64_t step) override {
        return compressedAllReduce(b, bucketIndex, step, /*betweenHosts=*/false, /*average=*/true);
    }
};

}  // namespace

std::unique_ptr<ExchangeStrategy> makeRingExchange(ExchangeEnv env) {
    return std::make_unique<RingExchange>(std::move(env));
}

}  // namespace lathe::core
