// The inference server: Boost.Beast sessions on a few I/O threads (an event loop each, a
// connection on one of them, no thread per connection), the dynamic batcher per model, hot swap, and
// Prometheus metrics through prometheus-cpp. Torch is reached only through LoadedModel. This file starts,
// loads and stops; the pieces are beside it: server_impl.h (the shared state), http_session.cpp (a connection
// and its endpoints), routes.cpp (the route table), server_metrics.cpp and gpu_probe.cpp (/metrics).
#include <pthread.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <chrono>
#include <cstdio>
#include <thread>

#include "http_session.h"
#include "lathe/core/error.h"
#include "lathe/core/server.h"
#include "lathe/core/sha256.h"
#include "server_impl.h"
#include "threads.h"

namespace beast = boost::beast;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace lathe::core {

using serving::Batcher;
using serving::LoadedModel;
using serving::ModelSlot;

std::unique_ptr<Batcher> InferenceServer::Impl::makeBatcher(const std::string& name,
                                                            const std::string& variant) {
    serving::BatcherStats stats;
    stats.onBatch = [this](const LoadedModel& model, int64_t rows, double computeS, double cpuS) {
        auto& pv = metrics.of(model.name(), model.version());
        pv.batch->Observe(static_cast<double>(rows));
        pv.compute->Observe(computeS);
        pv.computeCpu->Increment(cpuS);
    };
    // Set on every submit: the gauge is looked up once here, not per request.
    prometheus::Gauge* depth = variant.empty() ? &metrics.depth.Add({{"model", name}})
                                               : &metrics.depth.Add({{"model", name}, {"variant", variant}});
    stats.onQueueDepth = [depth](int64_t rows) { depth->Set(static_cast<double>(rows)); };
    return std::make_unique<Batcher>(
        options.maxBatch, options.maxDelayMs, options.maxQueue, std::move(stats), options.instances,
        options.batching == "fixed" ? Batcher::Policy::Fixed : Batcher::Policy::Adaptive);
}

std::shared_ptr<LoadedModel> InferenceServer::Impl::loadModel(const ServedModel& m, const std::string& sha) {
    auto fresh =
        LoadedModel::load(m, options.maxBatch, options.device, sha, options.instances, options.optimize);
    // In the server's log (a deployment's log file): which graph this version runs, and why.
    if (!fresh->optimization().empty())
        std::fprintf(stderr, "%s v%lld: %s\n", m.name.c_str(), static_cast<long long>(m.version),
                     fresh->optimization().c_str());
    return fresh;
}

void InferenceServer::Impl::load(const ServedModel& m, const std::string& sha) {
    std::lock_guard<std::mutex> loadLock(loadMutex);
    // Throws: the old one keeps serving.
    auto fresh = loadModel(m, sha);
    std::shared_ptr<ModelSlot> s;
    {
        std::unique_lock<std::shared_mutex> lk(modelsMutex);
        auto& entry = models[m.name];
        if (!entry) {
            entry = std::make_shared<ModelSlot>();
            entry->batcher = makeBatcher(m.name, {});
        }
        s = entry;
    }
    int64_t oldVersion = -1;
    std::shared_ptr<const serving::Candidate> promoted;
    {
        std::lock_guard<std::mutex> lk(s->mutex);
        if (s->current) oldVersion = s->current->version();
        s->current = std::move(fresh);  // requests already queued keep their own pointer to the old one
        // The rollout's candidate now serving as the current version (promoted, or deployed by
        // hand): the rollout is over.
        if (s->candidate && s->candidate->source.version == m.version) {
            promoted = std::move(s->candidate);
        } else if (s->candidate && s->candidate->split.baseline != m.version) {
            // A third version swapped in during a rollout: the split now compares with it, and
            // its requests are counted under its own version.
            auto next = std::make_shared<serving::Candidate>(*s->candidate);
            next->split.baseline = m.version;
            for (int by = 0; by < 2; ++by)
                next->routed[0][by] = &metrics.routed.Add({{"model", m.name},
                                                           {"version", std::to_string(m.version)},
                                                           {"by", by ? "user" : "random"}});
            s->candidate = std::move(next);
        }
    }
    if (promoted)
        std::fprintf(stderr, "lathe serve: rollout of %s ended: v%lld promoted, it serves everything\n",
                     m.name.c_str(), static_cast<long long>(m.version));
    metrics.of(m.name, m.version);
    metrics.setServed(m.name, oldVersion == m.version ? -1 : oldVersion, m.version);
    if (promoted) {
        metrics.weight.Add({{"model", m.name}, {"version", std::to_string(m.version)}}).Set(0);
        retire(promoted->batcher);
    }
}

namespace {

bool sameTensors(const std::vector<TensorSpec>& a, const std::vector<TensorSpec>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].name != b[i].name || a[i].datatype != b[i].datatype || a[i].shape != b[i].shape)
            return false;
    return true;
}

void checkWeight(int32_t bp) {
    if (bp < 0 || bp > serving::kBasisPoints)
        throw ConfigError("the candidate's weight must be 0 to 10000 basis points (0% to 100%), got " +
                          std::to_string(bp));
}

}  // namespace

void InferenceServer::Impl::startRollout(const ServedModel& m, const std::string& sha,
                                         serving::TrafficSplit split) {
    checkWeight(split.candidateBp);
    std::lock_guard<std::mutex> loadLock(loadMutex);
    const auto s = slot(m.name);
    const auto current = s ? s->get() : nullptr;
    if (!current)
        throw NotFoundError("no model named '" + m.name +
                            "' is served here: a rollout serves a candidate beside the version served now");
    if (m.version == current->version())
        throw ConfigError(m.name + " v" + std::to_string(m.version) +
                          " is the version served now; a rollout's candidate must be another version");
    std::shared_ptr<const serving::Candidate> old;
    {
        std::lock_guard<std::mutex> lk(s->mutex);
        old = s->candidate;
    }
    auto next = std::make_shared<serving::Candidate>();
    if (old && old->source.version == m.version) {
        *next = *old;  // the same candidate: only the split changes
    } else {
        next->model = loadModel(m, sha);
        if (!sameTensors(next->model->signature().inputs, current->signature().inputs) ||
            !sameTensors(next->model->signature().outputs, current->signature().outputs))
            throw ConfigError(m.name + " v" + std::to_string(m.version) +
                              " takes or gives other tensors than v" + std::to_string(current->version()) +
                              " (see GET /v2/models/" + m.name +
                              "): an A/B test compares versions that answer the same requests");
        next->batcher = makeBatcher(m.name, "candidate");
        next->source = m;
        next->sha256 = sha;
        const std::string v = std::to_string(m.version);
        for (int by = 0; by < 2; ++by) {
            const char* how = by ? "user" : "random";
            next->routed[1][by] = &metrics.routed.Add({{"model", m.name}, {"version", v}, {"by", how}});
        }
        metrics.of(m.name, m.version);
    }
    // The baseline's counters: the version served now (a hot swap since the last call may have
    // changed it).
    const std::string base = std::to_string(current->version());
    for (int by = 0; by < 2; ++by)
        next->routed[0][by] =
            &metrics.routed.Add({{"model", m.name}, {"version", base}, {"by", by ? "user" : "random"}});
    split.baseline = current->version();
    split.candidate = m.version;
    next->split = split;
    {
        std::lock_guard<std::mutex> lk(s->mutex);
        s->candidate = next;
    }
    metrics.weight.Add({{"model", m.name}, {"version", std::to_string(m.version)}})
        .Set(static_cast<double>(split.candidateBp));
    std::fprintf(stderr, "lathe serve: rollout of %s: v%lld beside v%lld at %g%%%s\n", m.name.c_str(),
                 static_cast<long long>(m.version), static_cast<long long>(current->version()),
                 split.candidateBp / 100.0,
                 split.userParameter.empty() ? "" : (", users by " + split.userParameter).c_str());
    // lathe_model_info stays the version served now: the candidate is told by its weight.
    if (old && old->batcher != next->batcher) {
        metrics.weight.Add({{"model", m.name}, {"version", std::to_string(old->source.version)}}).Set(0);
        retire(old->batcher);
    }
}

void InferenceServer::Impl::setRolloutWeight(const std::string& model, int32_t bp) {
    checkWeight(bp);
    std::lock_guard<std::mutex> loadLock(loadMutex);
    const auto s = slot(model);
    std::shared_ptr<const serving::Candidate> c;
    if (s) {
        std::lock_guard<std::mutex> lk(s->mutex);
        c = s->candidate;
        if (c) {
            auto next = std::make_shared<serving::Candidate>(*c);
            next->split.candidateBp = bp;
            s->candidate = next;
        }
    }
    if (!c)
        throw ConfigError("no rollout of '" + model + "' is in force: start one with a candidate version");
    metrics.weight.Add({{"model", model}, {"version", std::to_string(c->source.version)}})
        .Set(static_cast<double>(bp));
    std::fprintf(stderr, "lathe serve: rollout of %s: v%lld now at %g%% (was %g%%)\n", model.c_str(),
                 static_cast<long long>(c->source.version), bp / 100.0, c->split.candidateBp / 100.0);
}

void InferenceServer::Impl::endRollout(const std::string& model, const std::string& how) {
    if (how != "abort" && how != "promote")
        throw ConfigError("a rollout ends by \"abort\" or \"promote\", not \"" + how.substr(0, 32) + "\"");
    const auto s = slot(model);
    std::shared_ptr<const serving::Candidate> c;
    if (s) {
        std::lock_guard<std::mutex> lk(s->mutex);
        c = s->candidate;
    }
    if (!c) throw ConfigError("no rollout of '" + model + "' is in force");
    // Promoted: loaded afresh as the current version (a hot swap), which ends the rollout; the
    // candidate keeps its share until then.
    if (how == "promote") return load(c->source, c->sha256);
    std::lock_guard<std::mutex> loadLock(loadMutex);
    {
        std::lock_guard<std::mutex> lk(s->mutex);
        if (s->candidate != c)
            throw ConfigError("the rollout of '" + model + "' changed meanwhile; look again");
        s->candidate.reset();
    }
    const std::string v = std::to_string(c->source.version);
    metrics.weight.Add({{"model", model}, {"version", v}}).Set(0);
    std::fprintf(stderr,
                 "lathe serve: rollout of %s aborted: v%s out, the current version serves everything\n",
                 model.c_str(), v.c_str());
    retire(c->batcher);
}

void InferenceServer::Impl::retire(std::shared_ptr<Batcher> batcher) {
    // Off the caller's thread: requests routed to it just before the switch are still answered
    // by it; once no session holds it (or the server stops), it drains and ends.
    std::lock_guard<std::mutex> lk(retiringMutex);
    retiring.emplace_back([this, b = std::move(batcher)]() mutable {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (b.use_count() > 1 && !stopping && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        b->stop();
        b.reset();
    });
}

void InferenceServer::Impl::accept() {
    const size_t at = nextLoop++ % loops.size();
    acceptor->async_accept(
        loops[at]->get_executor(), [this, at](beast::error_code ec, serving::SessionSocket socket) {
            if (stopping || !acceptor->is_open()) return;
            if (!ec) std::make_shared<serving::Session>(std::move(socket), this, answers[at].get())->run();
            // EMFILE and the like: keep accepting; the failed connection is simply not
            // served.
            accept();
        });
}

void InferenceServer::Impl::stop() {
    std::lock_guard<std::mutex> lk(stopMutex);
    if (stopped) return;
    stopped = true;
    stopping = true;
    if (acceptor)
        net::post(*loops[0], [this] {
            beast::error_code ec;
            acceptor->close(ec);
        });
    // Queued requests are answered before the batchers end.
    std::vector<std::shared_ptr<ModelSlot>> slots;
    {
        std::shared_lock<std::shared_mutex> l(modelsMutex);
        for (auto& [n, s] : models) slots.push_back(s);
    }
    for (auto& s : slots) {
        s->batcher->stop();
        std::lock_guard<std::mutex> l(s->mutex);
        if (s->candidate) s->candidate->batcher->stop();
    }
    {
        std::lock_guard<std::mutex> l(loadersMutex);
        for (auto& t : loaders)
            if (t.joinable()) t.join();
    }
    {
        std::lock_guard<std::mutex> l(retiringMutex);
        for (auto& t : retiring)
            if (t.joinable()) t.join();
    }
    // A moment for the last answers to be written, then the I/O threads end.
    work.clear();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (auto& loop : loops) loop->stop();
    for (auto& t : threads)
        if (t.joinable()) t.join();
    for (auto& a : answers) a->release();
}

InferenceServer::InferenceServer(ServeOptions options) : d(std::make_unique<Impl>()) {
    if (options.maxBatch < 1) throw ConfigError("--max-batch must be at least 1");
    if (options.maxDelayMs < 0) throw ConfigError("--max-delay-ms must be 0 or more");
    if (options.batching != "adaptive" && options.batching != "fixed")
        throw ConfigError("--batching '" + options.batching + "': use adaptive or fixed");
    if (options.maxQueue < options.maxBatch) throw ConfigError("--max-queue must be at least --max-batch");
    if (options.ioThreads < 1) throw ConfigError("--threads must be at least 1");
    if (options.instances < 1 || options.instances > 64)
        throw ConfigError("--instances must be between 1 and 64");
    if (options.device != "auto" && options.device != "cpu" && options.device != "cuda")
        throw ConfigError("--device '" + options.device + "': use auto, cpu or cuda");
    if (options.optimize != "auto" && options.optimize != "on" && options.optimize != "off")
        throw ConfigError("--optimize '" + options.optimize + "': use auto, on or off");
    if (options.maxBodyBytes < 1024) throw ConfigError("the body limit must be at least 1 KiB");
    if (!options.controlToken.empty()) {
        // Never quoted back: the message names the rule only.
        const auto& t = options.controlToken;
        const bool visible = std::all_of(t.begin(), t.end(), [](char c) { return c > 0x20 && c < 0x7f; });
        if (t.size() < 16 || t.size() > 4096 || !visible)
            throw ConfigError("the control token must be 16 to 4096 visible ASCII characters (no spaces)");
        d->controlTokenSha256 = sha256Hex(t.data(), t.size());
        std::fill(options.controlToken.begin(), options.controlToken.end(), '\0');
        options.controlToken.clear();
    }
    d->loopbackOnly = isLoopbackHost(options.host);
    d->options = std::move(options);
    // The batcher runs one batch at a time beside the I/O threads: by default its BLAS and
    // intra-op threads take the cores the I/O threads leave (OpenBLAS's own pool would otherwise
    // take every core and fight the I/O threads, measured: a 32-row digits batch 0.03 ms alone,
    // up to 1.7 ms in the server under load).
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    setComputeThreads(d->options.computeThreads > 0
                          ? d->options.computeThreads
                          : std::max(1, (cores - d->options.ioThreads) / d->options.instances));
}

InferenceServer::~InferenceServer() { stop(); }

bool isLoopbackHost(const std::string& host) {
    if (host == "localhost") return true;
    beast::error_code ec;
    const auto a = net::ip::make_address(host, ec);
    if (ec) return false;
    if (a.is_v4()) return a.to_v4().is_loopback();
    const auto v6 = a.to_v6();
    if (v6.is_v4_mapped()) return net::ip::make_address_v4(net::ip::v4_mapped, v6).is_loopback();
    return v6.is_loopback();
}

void InferenceServer::load(const ServedModel& model, const std::string& sha256) {
    checkModelName(model.name);
    std::string sha = sha256;
    if (sha.empty() && model.version > 0 && !d->options.workspace.empty()) {
        Registry registry(d->options.workspace);
        sha = registry.resolve({model.name, model.version, {}}).sha256;
    }
    d->load(model, sha);
}

uint16_t InferenceServer::start() {
    if (!d->loops.empty()) throw Error("the inference server was started already: start it once");
    beast::error_code ec;
    const auto address = net::ip::make_address(d->options.host, ec);
    if (ec)
        throw ConfigError("--host '" + d->options.host +
                          "' is not an IP address (use e.g. 127.0.0.1 or 0.0.0.0)");
    const tcp::endpoint ep{address, d->options.port};
    for (int i = 0; i < d->options.ioThreads; ++i) {
        // Concurrency hint 1: each loop is run by one thread (other threads only post to it).
        d->loops.push_back(std::make_unique<net::io_context>(1));
        d->answers.push_back(std::make_unique<serving::AnswerQueue>(*d->loops.back()));
        d->work.push_back(net::make_work_guard(*d->loops.back()));
    }
    d->acceptor.emplace(*d->loops[0]);
    d->acceptor->open(ep.protocol(), ec);
    if (!ec) d->acceptor->set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) d->acceptor->bind(ep, ec);
    if (ec)
        throw Error("cannot listen on " + d->options.host + ":" + std::to_string(d->options.port) + ": " +
                    ec.message() +
                    (ec == net::error::address_in_use
                         ? " (another server is using the port; choose one with --port)"
                         : ""));
    d->acceptor->listen(net::socket_base::max_listen_connections, ec);
    if (ec) throw Error("cannot listen on port " + std::to_string(d->options.port) + ": " + ec.message());
    d->boundPort = d->acceptor->local_endpoint().port();
    d->accept();
    for (int i = 0; i < d->options.ioThreads; ++i)
        d->threads.emplace_back([loop = d->loops[static_cast<size_t>(i)].get()] {
            pthread_setname_np(pthread_self(), "lathe-http");
            // A handler that throws must cost one connection, not the server: Asio lets the
            // exception out of run(), so the thread logs it and goes back in.
            for (;;) {
                try {
                    loop->run();
                    return;
                } catch (const std::exception& ex) {
                    std::fprintf(stderr, "lathe serve: a request handler failed: %s\n", ex.what());
                }
            }
        });
    return d->boundPort;
}

uint16_t InferenceServer::port() const { return d->boundPort; }

int64_t InferenceServer::servedVersion(const std::string& name) const {
    auto s = d->slot(name);
    auto m = s ? s->get() : nullptr;
    return m ? m->version() : 0;
}

std::string InferenceServer::optimization(const std::string& name) const {
    auto s = d->slot(name);
    auto m = s ? s->get() : nullptr;
    return m ? m->optimization() : std::string();
}

void InferenceServer::stop() {
    if (d) d->stop();
}

void InferenceServer::runUntil(const std::atomic<bool>& stopFlag) {
    while (!stopFlag.load() && !d->stopping.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop();
}

}  // namespace lathe::core
