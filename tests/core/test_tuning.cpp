// Hyper-parameter search: the space's syntax and checks against the run-spec keys, the random
// and TPE samplers (TPE finds a narrow optimum that random search does not, on the same budget
// and seeds), and ASHA's promotion rule; a forked trial's compute threads.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <set>

#include "lathe/core/error.h"
#include "lathe/core/fork_server.h"
#include "torch_backend.h"
#include "tuning/search.h"

using namespace lathe::core;
using namespace lathe::core::tuning;

TEST_CASE("search spaces parse, and bad ones are refused naming the problem", "[tuning]") {
    auto p = parseParam("lr=loguniform(1e-4, 1e-1)");
    CHECK(p.key == "lr");
    CHECK(p.kind == Param::Kind::LogUniform);
    CHECK(p.lo == 1e-4);
    CHECK(p.describe() == "loguniform(0.0001, 0.1)");
    p = parseParam("hidden=choice([64],[128,128])");
    REQUIRE(p.choices.size() == 2);
    CHECK(p.choices[1] == "128,128");
    p = parseParam("batch=choice(32,64,128)");
    CHECK(p.choices == std::vector<std::string>{"32", "64", "128"});
    CHECK(parseParam("epochs=int(1,9)").kind == Param::Kind::Int);

    CHECK_THROWS_WITH(parseParam("lr"), Catch::Contains("KEY=uniform"));
    CHECK_THROWS_WITH(parseParam("lr=gauss(1,2)"), Catch::Contains("KEY=uniform"));
    CHECK_THROWS_WITH(parseParam("lrr=uniform(0.1,0.2)"), Catch::Contains("unknown run-spec key `lrr`"));
    CHECK_THROWS_WITH(parseParam("lr=loguniform(0,0.1)"), Catch::Contains("bounds > 0"));
    CHECK_THROWS_WITH(parseParam("lr=uniform(0.1,0.01)"), Catch::Contains("lower bound must be below"));
    CHECK_THROWS_WITH(parseParam("lr=uniform(0.1,20)"), Catch::Contains("`lr`"));  // lr <= 10
    CHECK_THROWS_WITH(parseParam("batch=uniform(8,64)"), Catch::Contains("whole numbers"));
    CHECK_THROWS_WITH(parseParam("optimizer=uniform(1,2)"), Catch::Contains("not numeric"));
    CHECK_THROWS_WITH(parseParam("optimizer=choice(sgd,rmsprop)"), Catch::Contains("rmsprop"));
    CHECK_THROWS_WITH(parseParam("batch=choice(32)"), Catch::Contains("at least two"));
    CHECK_THROWS_WITH(parseParam("batch=choice(32,32)"), Catch::Contains("twice"));
    SearchSpace twice{{parseParam("lr=uniform(0.1,0.2)"), parseParam("lr=uniform(0.1,0.3)")}};
    CHECK_THROWS_WITH(twice.check(), Catch::Contains("searched twice"));
    CHECK_THROWS_WITH(SearchSpace{}.check(), Catch::Contains("empty"));
}

TEST_CASE("random draws stay in range, cover it, and repeat with the seed", "[tuning]") {
    SearchSpace s{{parseParam("lr=loguniform(1e-4,1e-1)"), parseParam("batch=int(8,12)"),
                   parseParam("optimizer=choice(sgd,adam)")}};
    std::mt19937_64 rng(1), again(1);
    int low = 0, ends = 0, sgd = 0;
    std::set<std::string> batches;
    for (int i = 0; i < 2000; ++i) {
        const auto a = sampleRandom(s, rng);
        CHECK(a == sampleRandom(s, again));
        const double lr = std::stod(a.at("lr"));
        REQUIRE(lr >= 1e-4);
        REQUIRE(lr <= 1e-1);
        low += lr < 1e-3 ? 1 : 0;  // a third of the log range
        batches.insert(a.at("batch"));
        ends += a.at("batch") == "8" || a.at("batch") == "12" ? 1 : 0;
        sgd += a.at("optimizer") == "sgd" ? 1 : 0;
    }
    CHECK(low > 550);
    CHECK(low < 800);
    CHECK(batches == std::set<std::string>{"8", "9", "10", "11", "12"});
    CHECK(ends > 650);  // 2 of 5 values, each as likely as the others
    CHECK(ends < 950);
    CHECK(sgd > 900);
    CHECK(sgd < 1100);
}

TEST_CASE("TPE finds a narrow optimum better than random search on the same budget", "[tuning]") {
    // Minimise (log10 lr + 2.7)^2 + 0.5 * (momentum - 0.93)^2 * 100, optimum lr = 2e-3.
    SearchSpace s{{parseParam("lr=loguniform(1e-5,1)"), parseParam("momentum=uniform(0,0.99)")}};
    auto f = [](const Assignment& a) {
        const double x = std::log10(std::stod(a.at("lr"))) + 2.7, m = std::stod(a.at("momentum")) - 0.93;
        return x * x + 50 * m * m;
    };
    double tpeSum = 0, randomSum = 0;
    int tpeWins = 0;
    for (uint64_t seed = 0; seed < 10; ++seed) {
        std::mt19937_64 r1(seed), r2(seed);
        std::vector<Observation> tpe, random;
        double bestT = 1e9, bestR = 1e9;
        for (int t = 0; t < 40; ++t) {
            auto a = sampleTpe(s, tpe, Direction::Minimize, r1);
            tpe.push_back({a, f(a)});
            bestT = std::min(bestT, f(a));
            auto b = sampleRandom(s, r2);
            random.push_back({b, f(b)});
            bestR = std::min(bestR, f(b));
        }
        tpeSum += bestT;
        randomSum += bestR;
        tpeWins += bestT < bestR ? 1 : 0;
    }
    INFO("mean best: TPE " << tpeSum / 10 << ", random " << randomSum / 10);
    CHECK(tpeSum < 0.5 * randomSum);
    CHECK(tpeWins >= 7);

    // Categorical: the good choice is taken more and more often.
    SearchSpace c{{parseParam("optimizer=choice(sgd,adam,adamw)")}};
    std::mt19937_64 rng(3);
    std::vector<Observation> h;
    int adamw = 0;
    for (int t = 0; t < 60; ++t) {
        auto a = sampleTpe(c, h, Direction::Maximize, rng);
        const double v = a.at("optimizer") == "adamw" ? 1.0 : 0.0;
        h.push_back({a, v});
        if (t >= 30) adamw += static_cast<int>(v);
    }
    CHECK(adamw > 20);  // of the last 30 (random would give about 10)
}

TEST_CASE("TPE ranks a pruned trial's low-fidelity value below every complete trial", "[tuning]") {
    // Ten complete trials of sgd at 0.5, ten of adam pruned at rung 3 with 0.9 (a value after 3
    // epochs, not comparable with one after the full budget): the good set is the complete ones.
    SearchSpace c{{parseParam("optimizer=choice(sgd,adam)")}};
    std::vector<Observation> h;
    for (int i = 0; i < 10; ++i) h.push_back({{{"optimizer", "sgd"}}, 0.5 + 0.001 * i, std::nullopt});
    for (int i = 0; i < 10; ++i) h.push_back({{{"optimizer", "adam"}}, 0.9, 3.0});
    // Among pruned trials a later rung ranks first: adam stopped at 9 beats sgd stopped at 3.
    std::vector<Observation> pruned;
    for (int i = 0; i < 10; ++i) pruned.push_back({{{"optimizer", "sgd"}}, 0.95, 3.0});
    for (int i = 0; i < 10; ++i) pruned.push_back({{{"optimizer", "adam"}}, 0.6, 9.0});
    std::mt19937_64 rng(5);
    int sgd = 0, adam = 0;
    for (int t = 0; t < 40; ++t) {
        sgd += sampleTpe(c, h, Direction::Maximize, rng).at("optimizer") == "sgd" ? 1 : 0;
        adam += sampleTpe(c, pruned, Direction::Maximize, rng).at("optimizer") == "adam" ? 1 : 0;
    }
    CHECK(sgd >= 35);  // by value alone the pruned adam trials would be the good set
    CHECK(adam >= 35);
}

TEST_CASE("ASHA's rungs and its asynchronous promotion rule", "[tuning]") {
    Asha a{1, 27, 3};
    CHECK(a.rungs() == std::vector<double>{1, 3, 9, 27});
    CHECK(Asha{2, 20, 3}.rungs() == std::vector<double>{2, 6, 18});
    // Alone at a rung, or the best of fewer than eta: promoted; otherwise the top floor(n/eta).
    CHECK(Asha::promote(0.5, {0.5}, Direction::Maximize, 3));
    CHECK(Asha::promote(0.6, {0.5, 0.6}, Direction::Maximize, 3));
    CHECK_FALSE(Asha::promote(0.5, {0.5, 0.6}, Direction::Maximize, 3));
    const std::vector<double> six{0.1, 0.9, 0.8, 0.3, 0.4, 0.2};
    CHECK(Asha::promote(0.9, six, Direction::Maximize, 3));
    CHECK(Asha::promote(0.8, six, Direction::Maximize, 3));
    CHECK_FALSE(Asha::promote(0.4, six, Direction::Maximize, 3));
    CHECK(Asha::promote(0.1, six, Direction::Minimize, 3));
    CHECK(Asha::promote(0.2, six, Direction::Minimize, 3));
    CHECK_FALSE(Asha::promote(0.3, six, Direction::Minimize, 3));
}

// lathectl tune's fork server sets one compute thread before it forks trials; OpenBLAS stops its
// pool at each fork. A trial that asks for one thread must not restart the pool: the restarted
// worker would spin for about 0.1 s of CPU (OpenBLAS's THREAD_TIMEOUT) beside every trial.
TEST_CASE("a process forked with one BLAS thread set, asking for one, starts no BLAS worker", "[tuning]") {
    using lathe::core::torch_impl::setBlasThreads;
    const auto get = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    const int before = get ? get() : 1;
    if (!setBlasThreads(1)) {
        WARN("OpenBLAS is not the BLAS loaded here: nothing to check");
        return;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::alarm(10);  // a child stuck on a lock held at the fork fails the test, not the suite
        // Only the forking thread exists in the child; setting the same count again must keep it so.
        setBlasThreads(1);
        ::_exit(lathe::core::threadCount() == 1 ? 0 : 10 + lathe::core::threadCount());
    }
    REQUIRE(pid > 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    INFO("exit 10 + N: the child ran N threads after asking for one BLAS thread");
    CHECK(WEXITSTATUS(status) == 0);
    // A count that changes does start the pool the child then needs.
    const pid_t two = ::fork();
    if (two == 0) {
        ::alarm(10);
        setBlasThreads(2);
        ::_exit(lathe::core::threadCount());
    }
    REQUIRE(two > 0);
    REQUIRE(::waitpid(two, &status, 0) == two);
    REQUIRE(WIFEXITED(status));
    // OpenBLAS's own threads (openblas_get_parallel() == 1; its OpenMP build has none of its
    // own), on a machine with more than one core.
    const auto parallel = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
    if (parallel && parallel() == 1 && sysconf(_SC_NPROCESSORS_ONLN) > 1) CHECK(WEXITSTATUS(status) > 1);
    setBlasThreads(before);
}
