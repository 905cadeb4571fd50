// The reducer in-process on a one-rank Gloo group: what its compressed exchange keeps between
// steps. Multi-rank behaviour is tested end to end through worker processes (test_distributed).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "distributed/exchange.h"
#include "distributed/reducer.h"
#include "lathe/core/error.h"
#include "lathe/core/run_spec.h"

using namespace lathe::core;

namespace {

int freePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE("error-feedback residuals follow the loss scale when it changes", "[distributed][reducer]") {
    DistEnv env;
    env.masterPort = freePort();
    env.timeoutSec = 30;
    DistContext ctx(env);
    torch::manual_seed(3);
    const auto g1 = torch::randn({5000}), g2 = torch::randn({5000});
    for (const char* format : {"int8", "int4"}) {
        INFO(format);
        CompressOptions c;
        c.format = format;
        c.errorFeedback = true;
        // Step 1's gradient at loss scale s1, step 2's at scale 1; returns step 2's exchanged gradient.
        auto run = [&](double s1, bool rescale) {
            auto p = torch::zeros({5000}).requires_grad_(true);
            Reducer reducer(ctx, {p}, 1, c);
            reducer.prepare(1);
            (p * (g1 * s1)).sum().backward();
            reducer.finish();
            if (rescale) reducer.rescaleResiduals(1.0 / s1);
            p.mutable_grad() = torch::Tensor();
            reducer.prepare(2);
            (p * g2).sum().backward();
            reducer.finish();
            return p.grad().clone();
        };
        const auto steady = run(1, false);
        // A power-of-two scale quantizes to exactly scaled codes and residuals, so once the
        // residual is brought back to scale 1 the second step is bit for bit the steady one.
        CHECK(torch::equal(run(4, true), steady));
        // Left at scale 4, the residual carries four times the error into step 2.
        CHECK_FALSE(torch::equal(run(4, false), steady));
    }
}

TEST_CASE("each exchange strategy is found by the name the run spec offers", "[distributed][reducer]") {
    std::vector<std::string> offered;
    for (const auto& k : specKeys())
        if (k.name == "strategy") offered = k.choices;
    std::vector<std::string> registered;
    for (const auto& s : exchangeStrategies()) registered.emplace_back(s.name);
    CHECK(offered == registered);

    DistEnv env;
    env.masterPort = freePort();
    env.timeoutSec = 30;
    DistContext ctx(env);
    ctx.initHierarchy(1);
    Codec codec(CompressOptions{}, torch::kCPU);
    for (const auto& name : registered) {
        ExchangeEnv e;
        e.ctx = &ctx;
        e.codec = &codec;
        const auto s = makeExchangeStrategy(name, e);
        CHECK(s->name() == name);
    }
    try {
        ExchangeEnv e;
        e.ctx = &ctx;
        e.codec = &codec;
        makeExchangeStrategy("butterfly", e);
        FAIL("an unknown strategy was made");
    } catch (const ConfigError& err) {
        CHECK_THAT(err.what(), Catch::Contains("`strategy` must be one of ring, hierarchical, ps") &&
                                   Catch::Contains("butterfly"));
    }

    // On one rank every strategy's average is the gradient itself (compressed: within fp16's
    // rounding), through the reducer's asynchronous or threaded path alike.
    torch::manual_seed(5);
    const auto g = torch::randn({3000});
    for (const auto& name : registered)
        for (const char* format : {"none", "fp16"}) {
            INFO(name << " " << format);
            CompressOptions c;
            c.strategy = name;
            c.format = format;
            auto p = torch::zeros({3000}).requires_grad_(true);
            Reducer reducer(ctx, {p}, 1, c);
            CHECK(reducer.strategy().rfind(name, 0) == 0);
            reducer.prepare(1);
            (p * g).sum().backward();
            const auto stats = reducer.finish();
            CHECK(stats.buckets == 1);
            CHECK(torch::allclose(p.grad(), g, 1e-3, 1e-3));
        }

    // Sparse gradients only where the strategy can take them.
    auto table = torch::zeros({10, 4}).requires_grad_(true);
    CompressOptions ring;
    CHECK_THROWS_WITH(Reducer(ctx, {table}, 1, ring, {0}), Catch::Contains("use strategy = \"ps\""));
}

TEST_CASE("gradients alias the reducer's buckets: no copies, zero_grad works, and the hooks leave with it",
          "[distributed][reducer]") {
    DistEnv env;
    env.masterPort = freePort();
    env.timeoutSec = 30;
    DistContext ctx(env);
    torch::manual_seed(7);
    const auto g1 = torch::randn({3000}), g2 = torch::randn({20, 50});
    auto p1 = torch::zeros({3000}).requires_grad_(true);
    auto p2 = torch::zeros({20, 50}).requires_grad_(true);
    torch::optim::SGD opt(std::vector<torch::Tensor>{p1, p2}, 0.1);
    auto backward = [&](double k1, double k2) {
        auto loss = (p1 * (g1 * k1)).sum();
        if (k2 != 0) loss = loss + (p2 * (g2 * k2)).sum();
        loss.backward();
    };
    {
        Reducer reducer(ctx, {p1, p2}, 1, CompressOptions{});
        reducer.prepare(1);
        backward(1, 1);
        reducer.finish();
        CHECK(torch::equal(p1.grad(), g1));
        CHECK(torch::equal(p2.grad(), g2));
        // From the first exchange on, both gradients are the one bucket's memory.
        REQUIRE(p1.grad().storage().is_alias_of(p2.grad().storage()));
        const void* const at1 = p1.grad().data_ptr();
        const void* const at2 = p2.grad().data_ptr();

        opt.zero_grad();  // detach_() and zero_(): refused on an autograd view, fine on an alias
        CHECK(p1.grad().count_nonzero().item<int64_t>() == 0);
        reducer.prepare(2);
        backward(2, 3);
        reducer.finish();
        CHECK(torch::equal(p1.grad(), g1 * 2));
        CHECK(torch::equal(p2.grad(), g2 * 3));
        CHECK(p1.grad().data_ptr() == at1);
        CHECK(p2.grad().data_ptr() == at2);

        // A parameter this step's graph leaves out averages to zeros, as every rank must send.
        opt.zero_grad();
        reducer.prepare(3);
        backward(1, 0);
        reducer.finish();
        CHECK(torch::equal(p1.grad(), g1));
        CHECK(p2.grad().count_nonzero().item<int64_t>() == 0);
    }
    // The reducer is gone: backward accumulates as plain autograd does, with no hook left to call.
    backward(1, 1);
    CHECK(torch::equal(p1.grad(), g1 * 2));
    CHECK(torch::equal(p2.grad(), g2));
}
