// The inference server: Boost.Beast sessions on a few I/O threads (a strand per connection, no
// thread per connection), the dynamic batcher per model, hot swap, and Prometheus metrics through
// prometheus-cpp. Torch is reached only through LoadedModel.
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <thread>

#include "batcher.h"
#include "infer_protocol.h"
#include "lathe/core/error.h"
#include "lathe/core/server.h"
#include "lathe/kernels/info.h"
#include "threads.h"

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace lathe::core {
namespace {

using serving::Batcher;
using serving::BatchResult;
using serving::Clock;
using serving::LoadedModel;
using serving::PendingRequest;
using Response = http::response<http::string_body>;

const prometheus::Histogram::BucketBoundaries kLatencyBuckets{
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
    0.05,   0.075, 0.1,   0.15,  0.25,  0.5,    1,    2.5,   5,    10};
const prometheus::Histogram::BucketBoundaries kBatchBuckets{1, 2, 4, 8, 16, 32, 64, 128, 256};

// Metric families and the per-label children, created once per (model, version[, code]).
struct Metrics {
    prometheus::Registry registry;
    prometheus::Family<prometheus::Counter>& requests =
        prometheus::BuildCounter()
            .Name("lathe_requests_total")
            .Help("Inference requests by model, version and HTTP status")
            .Register(registry);
    prometheus::Family<prometheus::Histogram>& latency =
        prometheus::BuildHistogram()
            .Name("lathe_request_duration_seconds")
            .Help("Request latency from the whole request read to the response handed to the socket")
            .Register(registry);
    prometheus::Family<prometheus::Histogram>& queue = prometheus::BuildHistogram()
                                                           .Name("lathe_queue_duration_seconds")
                                                           .Help("Time a request waited for its batch")
                                                           .Register(registry);
    prometheus::Family<prometheus::Histogram>& compute = prometheus::BuildHistogram()
                                                             .Name("lathe_compute_duration_seconds")
                                                             .Help("Forward time per batch")
                                                             .Register(registry);
    prometheus::Family<prometheus::Histogram>& batch = prometheus::BuildHistogram()
                                                           .Name("lathe_batch_size")
                                                           .Help("Rows per executed batch")
                                                           .Register(registry);
    prometheus::Family<prometheus::Gauge>& depth = prometheus::BuildGauge()
                                                       .Name("lathe_queue_depth")
                                                       .Help("Rows waiting for a batch")
                                                       .Register(registry);
    prometheus::Family<prometheus::Gauge>& info = prometheus::BuildGauge()
                                                      .Name("lathe_model_info")
                                                      .Help("1 for the version now served under a model name")
                                                      .Register(registry);
    prometheus::Family<prometheus::Counter>& cpu = prometheus::BuildCounter()
                                                       .Name("process_cpu_seconds_total")
                                                       .Help("User and system CPU time of the server process")
                                                       .Register(registry);
    prometheus::Family<prometheus::Gauge>& rss = prometheus::BuildGauge()
                                                     .Name("process_resident_memory_bytes")
                                                     .Help("Resident memory of the server process")
                                                     .Register(registry);
    prometheus::Family<prometheus::Gauge>& gpuUtil = prometheus::BuildGauge()
                                                         .Name("lathe_gpu_utilization_percent")
                                                         .Help("GPU utilisation")
                                                         .Register(registry);
    prometheus::Family<prometheus::Gauge>& gpuMem = prometheus::BuildGauge()
                                                        .Name("lathe_gpu_memory_used_bytes")
                                                        .Help("GPU memory in use")
                                                        .Register(registry);

    struct PerVersion {
        prometheus::Histogram* latency;
        prometheus::Histogram* queue;
        prometheus::Histogram* compute;
        prometheus::Histogram* batch;
    };
    std::mutex mutex;
    std::map<std::pair<std::string, int64_t>, PerVersion> perVersion;
    std::map<std::tuple<std::string, int64_t, int>, prometheus::Counter*> counters;
    double lastCpu = 0;

    PerVersion& of(const std::string& model, int64_t version) {
        std::lock_guard<std::mutex> lk(mutex);
        auto it = perVersion.find({model, version});
        if (it != perVersion.end()) return it->second;
        const prometheus::Labels l{{"model", model}, {"version", std::to_string(version)}};
        PerVersion p{&latency.Add(l, kLatencyBuckets), &queue.Add(l, kLatencyBuckets),
                     &compute.Add(l, kLatencyBuckets), &batch.Add(l, kBatchBuckets)};
        return perVersion.emplace(std::make_pair(model, version), p).first->second;
    }
    void count(const std::string& model, int64_t version, int code) {
        prometheus::Counter* c;
        {
            std::lock_guard<std::mutex> lk(mutex);
            auto& slot = counters[{model, version, code}];
            if (!slot)
                slot = &requests.Add(
                    {{"model", model}, {"version", std::to_string(version)}, {"code", std::to_string(code)}});
            c = slot;
        }
        c->Increment();
    }
    void setServed(const std::string& model, int64_t oldVersion, int64_t newVersion) {
        if (oldVersion >= 0) info.Add({{"model", model}, {"version", std::to_string(oldVersion)}}).Set(0);
        info.Add({{"model", model}, {"version", std::to_string(newVersion)}}).Set(1);
    }
    // Process figures are read when scraped.
    void refreshProcess() {
        rusage ru{};
        getrusage(RUSAGE_SELF, &ru);
        const double cpuNow = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                              1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
        {
            std::lock_guard<std::mutex> lk(mutex);
            if (cpuNow > lastCpu) cpu.Add({}).Increment(cpuNow - lastCpu);
            lastCpu = std::max(lastCpu, cpuNow);
        }
        std::ifstream statm("/proc/self/statm");
        long pages = 0, resident = 0;
        if (statm >> pages >> resident)
            rss.Add({}).Set(static_cast<double>(resident) * sysconf(_SC_PAGESIZE));
    }
};

// GPU utilisation and memory through nvidia-smi (NVML's header is not in the toolkit here),
// read at most every 2 s and only on machines with a CUDA device.
struct GpuProbe {
    bool present = kernels::cudaDeviceCount() > 0;
    Clock::time_point last{};
    std::mutex mutex;
    void refresh(Metrics& m) {
        if (!present) return;
        std::lock_guard<std::mutex> lk(mutex);
        if (Clock::now() - last < std::chrono::seconds(2)) return;
        last = Clock::now();
        FILE* p = ::popen(
            "nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -i 0 "
            "2>/dev/null",
            "r");
        if (!p) return;
        double util = 0, memMiB = 0;
        if (std::fscanf(p, "%lf, %lf", &util, &memMiB) == 2) {
            m.gpuUtil.Add({}).Set(util);
            m.gpuMem.Add({}).Set(memMiB * 1024 * 1024);
        }
        ::pclose(p);
    }
};

struct ModelSlot {
    mutable std::mutex mutex;
    std::shared_ptr<LoadedModel> current;
    std::unique_ptr<Batcher> batcher;
    std::shared_ptr<LoadedModel> get() const {
        std::lock_guard<std::mutex> lk(mutex);
        return current;
    }
};

}  // namespace

struct InferenceServer::Impl {
    ServeOptions options;
    net::io_context ioc;
    std::optional<tcp::acceptor> acceptor;
    std::vector<std::thread> threads;
    std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
    uint16_t boundPort = 0;
    std::atomic<bool> stopping{false};
    bool stopped = false;
    std::mutex stopMutex;

    std::shared_mutex modelsMutex;
    std::map<std::string, std::shared_ptr<ModelSlot>> models;
    std::mutex loadMutex;  // one load at a time: a second waits rather than racing the first
    std::vector<std::thread> loaders;
    std::mutex loadersMutex;

    Metrics metrics;
    GpuProbe gpu;

    std::shared_ptr<ModelSlot> slot(const std::string& name) {
        std::shared_lock<std::shared_mutex> lk(modelsMutex);
        auto it = models.find(name);
        return it == models.end() ? nullptr : it->second;
    }

    void load(const ServedModel& m, const std::string& sha) {
        std::lock_guard<std::mutex> loadLock(loadMutex);
        // Throws: the old one keeps serving.
        auto fresh =
            LoadedModel::load(m, options.maxBatch, options.device, sha, options.instances, options.optimize);
        // In the server's log (a deployment's log file): which graph this version runs, and why.
        if (!fresh->optimization().empty())
            std::fprintf(stderr, "%s v%lld: %s\n", m.name.c_str(), static_cast<long long>(m.version),
                         fresh->optimization().c_str());
        std::shared_ptr<ModelSlot> s;
        {
            std::unique_lock<std::shared_mutex> lk(modelsMutex);
            auto& entry = models[m.name];
            if (!entry) {
                entry = std::make_shared<ModelSlot>();
                const std::string name = m.name;
                serving::BatcherStats stats;
                stats.onBatch = [this](const LoadedModel& model, int64_t rows, double computeS) {
                    auto& pv = metrics.of(model.name(), model.version());
                    pv.batch->Observe(static_cast<double>(rows));
                    pv.compute->Observe(computeS);
                };
                stats.onQueueDepth = [this, name](int64_t rows) {
                    metrics.depth.Add({{"model", name}}).Set(static_cast<double>(rows));
                };
                entry->batcher =
                    std::make_unique<Batcher>(options.maxBatch, options.maxDelayMs, options.maxQueue,
                                              std::move(stats), options.instances);
            }
            s = entry;
        }
        int64_t oldVersion = -1;
        {
            std::lock_guard<std::mutex> lk(s->mutex);
            if (s->current) oldVersion = s->current->version();
            s->current = std::move(fresh);  // requests already queued keep their own pointer to the old one
        }
        metrics.of(m.name, m.version);
        metrics.setServed(m.name, oldVersion == m.version ? -1 : oldVersion, m.version);
    }

    void accept();
    void stop();
};

namespace {

std::string jsonOk(const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class Session : public std::enable_shared_from_this<Session> {
public:
    Session(tcp::socket&& socket, InferenceServer::Impl* server)
        : m_stream(std::move(socket)), m_timer(m_stream.get_executor()), m_server(server) {}

    void run() {
        net::dispatch(m_stream.get_executor(), [self = shared_from_this()] { self->read(); });
    }

private:
    using Request = http::request<http::string_body>;

    void read() {
        if (m_server->stopping) return close();
        m_parser.emplace();
        m_parser->body_limit(static_cast<uint64_t>(m_server->options.maxBodyBytes));
        m_parser->header_limit(16 * 1024);
        // The whole request must arrive within the idle timeout: a client that stalls mid-request
        // (or trickles bytes) gets 408 instead of holding a connection forever. Our own timer
        // rather than the stream's timeout, which would close the socket before we could answer.
        m_stream.expires_never();
        m_timedOut = false;
        m_timer.expires_after(
            std::chrono::milliseconds(static_cast<int64_t>(m_server->options.idleTimeoutS * 1000)));
        m_timer.async_wait([self = shared_from_this()](beast::error_code ec) {
            if (ec) return;  // cancelled: the request arrived in time
            self->m_timedOut = true;
            beast::error_code ignored;
            self->m_stream.socket().cancel(ignored);
        });
        http::async_read(m_stream, m_buffer, *m_parser,
                         [self = shared_from_this()](beast::error_code ec, size_t) { self->onRead(ec); });
    }

    void onRead(beast::error_code ec) {
        m_timer.cancel();
        if (m_timedOut && ec) ec = beast::error::timeout;
        if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset)
            return close();
        if (ec == beast::error::timeout) {
            // Nothing was started: a keep-alive connection that went quiet is closed silently;
            // one that stalled mid-request learns why.
            if (m_parser && m_parser->got_some())
                return sendError(408, "request not received within the timeout", false);
            return close();
        }
        if (ec == http::error::body_limit)
            return sendError(
                413,
                "request body is larger than " + std::to_string(m_server->options.maxBodyBytes) + " bytes",
                false);
        if (ec == http::error::header_limit) return sendError(431, "request headers are too large", false);
        if (ec) return sendError(400, std::string("malformed HTTP request: ") + ec.message(), false);
        m_request = m_parser->release();
        m_started = Clock::now();
        handle();
    }

    void handle() {
        std::string target(m_request.target());
        if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
        std::vector<std::string> seg;
        for (size_t pos = 1; pos <= target.size();) {
            auto next = target.find('/', pos);
            if (next == std::string::npos) next = target.size();
            if (next > pos) seg.push_back(target.substr(pos, next - pos));
            pos = next + 1;
        }
        const auto method = m_request.method();
        auto is = [&](std::initializer_list<const char*> parts) {
            if (seg.size() != parts.size()) return false;
            size_t i = 0;
            for (const char* p : parts) {
                if (std::string(p) != "*" && seg[i] != p) return false;
                ++i;
            }
            return true;
        };
        auto requireMethod = [&](http::verb v) {
            if (method == v) return true;
            sendError(405, std::string("use ") + std::string(http::to_string(v)) + " for " + target);
            return false;
        };

        if (is({"metrics"})) {
            if (!requireMethod(http::verb::get)) return;
            m_server->metrics.refreshProcess();
            m_server->gpu.refresh(m_server->metrics);
            prometheus::TextSerializer ser;
            return send(200, ser.Serialize(m_server->metrics.registry.Collect()),
                        "text/plain; version=0.0.4");
        }
        if (seg.empty() || seg[0] != "v2") return sendError(404, "no such endpoint: " + target);
        if (is({"v2"})) {
            if (!requireMethod(http::verb::get)) return;
            return send(200, jsonOk({{"name", "lathe"},
                                     {"version", "0.1.0"},
                                     {"extensions", {"model_repository", "binary_tensor_data"}},
                                     {"instance", m_server->options.instance}}));
        }
        if (is({"v2", "health", "live"})) {
            if (!requireMethod(http::verb::get)) return;
            return send(200, jsonOk({{"live", true}}));
        }
        if (is({"v2", "health", "ready"})) {
            if (!requireMethod(http::verb::get)) return;
            bool ready = !m_server->stopping;
            {
                std::shared_lock<std::shared_mutex> lk(m_server->modelsMutex);
                ready = ready && !m_server->models.empty();
            }
            return send(ready ? 200 : 503, jsonOk({{"ready", ready}}));
        }
        if (is({"v2", "repository", "index"})) {
            if (!requireMethod(http::verb::post)) return;
            nlohmann::json a = nlohmann::json::array();
            std::shared_lock<std::shared_mutex> lk(m_server->modelsMutex);
            for (const auto& [name, s] : m_server->models)
                if (auto m = s->get())
                    a.push_back(
                        {{"name", name}, {"version", std::to_string(m->version())}, {"state", "READY"}});
            return send(200, jsonOk(a));
        }
        if (is({"v2", "repository", "models", "*", "load"})) {
            if (!requireMethod(http::verb::post)) return;
            return loadModel(seg[3]);
        }
        if (seg.size() >= 3 && seg[1] == "models") {
            const std::string& name = seg[2];
            auto s = m_server->slot(name);
            auto model = s ? s->get() : nullptr;
            if (!model) return sendError(404, "no model named '" + name + "' is served here");
            size_t rest = 3;
            if (seg.size() >= 5 && seg[3] == "versions") {
                if (seg[4] != std::to_string(model->version()))
                    return sendError(404, "model '" + name + "' version " + seg[4] +
                                              " is not served (serving version " +
                                              std::to_string(model->version()) + ")");
                rest = 5;
            }
            if (seg.size() == rest) {
                if (!requireMethod(http::verb::get)) return;
                return send(200, serving::modelMetadata(name, model->version(), model->signature()));
            }
            if (seg.size() == rest + 1 && seg[rest] == "ready") {
                if (!requireMethod(http::verb::get)) return;
                return send(200, jsonOk({{"name", name}, {"ready", true}}));
            }
            if (seg.size() == rest + 1 && seg[rest] == "infer") {
                if (!requireMethod(http::verb::post)) return;
                return infer(s, model);
            }
        }
        sendError(404, "no such endpoint: " + target);
    }

    void infer(const std::shared_ptr<ModelSlot>& slot, std::shared_ptr<LoadedModel> model) {
        serving::InferRequest req;
        serving::ProtocolError err;
        const auto headerLength = m_request.find(serving::kInferHeaderLength);
        if (!serving::parseInferRequest(
                m_request.body(), model->signature(), model->maxBatch(), req, err,
                headerLength == m_request.end()
                    ? std::nullopt
                    : std::optional<std::string_view>(
                          std::string_view(headerLength->value().data(), headerLength->value().size())))) {
            m_server->metrics.count(model->name(), model->version(), err.status);
            return sendError(err.status, err.message);
        }
        PendingRequest p;
        p.model = model;
        p.rows = req.rows;
        p.input = std::move(req.data);
        p.enqueued = Clock::now();
        p.done = [self = shared_from_this(), model, id = std::move(req.id), rows = req.rows,
                  binary = req.binaryOutput](BatchResult&& r) {
            // Back onto this connection's strand: the batcher thread must not touch the socket,
            // and JSON encoding belongs on the I/O threads, not in the batch loop.
            net::post(self->m_stream.get_executor(),
                      [self, model, id, rows, binary, r = std::move(r)]() mutable {
                          self->answer(*model, id, rows, binary, r);
                      });
        };
        if (!slot->batcher->submit(std::move(p))) {
            m_server->metrics.count(model->name(), model->version(), 503);
            Response res{http::status::service_unavailable, m_request.version()};
            res.set(http::field::retry_after, "1");
            res.set(http::field::content_type, "application/json");
            res.body() =
                serving::errorBody("server overloaded: the request queue is full (--max-queue " +
                                   std::to_string(m_server->options.maxQueue) + " rows); retry later");
            return write(std::move(res));
        }
    }

    void answer(const LoadedModel& model, const std::string& id, int64_t rows, bool binary, BatchResult& r) {
        m_server->metrics.count(model.name(), model.version(), r.status);
        if (r.status != 200) return sendError(r.status, r.error);
        auto& pv = m_server->metrics.of(model.name(), model.version());
        pv.queue->Observe(r.queueS);
        auto out = serving::inferResponse(model.name(), model.version(), id, model.signature().outputs[0],
                                          rows, r.output.data(), model.outputElems(), binary);
        if (out.jsonLength < 0)
            send(200, std::move(out.body));
        else
            send(200, std::move(out.body), "application/octet-stream", out.jsonLength);
        pv.latency->Observe(std::chrono::duration<double>(Clock::now() - m_started).count());
    }

    void loadModel(const std::string& name) {
        if (m_server->options.workspace.empty())
            return sendError(400,
                             "this server was started with --file and has no registry to load versions from");
        ModelRef ref;
        try {
            checkModelName(name);
            ref.name = name;
            const auto j =
                nlohmann::json::parse(m_request.body().empty() ? std::string("{}") : m_request.body());
            const auto params = j.value("parameters", nlohmann::json::object());
            if (params.contains("version")) {
                const auto& v = params["version"];
                ref.version = v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
                if (ref.version <= 0) throw ConfigError("`version` must be a positive number");
            } else if (params.contains("alias")) {
                ref.alias = params["alias"].get<std::string>();
                checkModelName(ref.alias, "alias");
            }
        } catch (const std::exception& ex) {
            return sendError(400, std::string("bad load request: ") + ex.what());
        }
        // Loading takes seconds: on its own thread, answered on this connection's strand when done.
        std::lock_guard<std::mutex> lk(m_server->loadersMutex);
        m_server->loaders.emplace_back([self = shared_from_this(), ref] {
            int status = 200;
            std::string body;
            try {
                Registry registry(self->m_server->options.workspace);
                const auto v = registry.resolve(ref);
                self->m_server->load({ref.name, v.version, v.path}, v.sha256);
                body = jsonOk({{"name", ref.name}, {"version", std::to_string(v.version)}});
            } catch (const NotFoundError& ex) {
                status = 404;
                body = serving::errorBody(ex.what());
            } catch (const ConfigError& ex) {
                status = 400;
                body = serving::errorBody(ex.what());
            } catch (const std::exception& ex) {
                status = 500;
                body = serving::errorBody(std::string("load failed, the previous version keeps serving: ") +
                                          ex.what());
            }
            net::post(self->m_stream.get_executor(), [self, status, body = std::move(body)]() mutable {
                self->send(status, std::move(body));
            });
        });
    }

    // `jsonLength` >= 0: a binary tensor data body, whose JSON part is that long.
    void send(int status, std::string body, const char* type = "application/json", int64_t jsonLength = -1) {
        Response res{static_cast<http::status>(status), m_request.version()};
        res.set(http::field::server, "lathe");
        res.set(http::field::content_type, type);
        if (jsonLength >= 0) res.set(serving::kInferHeaderLength, std::to_string(jsonLength));
        res.body() = std::move(body);
        write(std::move(res));
    }

    void sendError(int status, const std::string& message, bool keepAlive = true) {
        Response res{static_cast<http::status>(status), m_request.version() ? m_request.version() : 11};
        res.set(http::field::server, "lathe");
        res.set(http::field::content_type, "application/json");
        res.body() = serving::errorBody(message);
        if (!keepAlive) res.keep_alive(false);
        write(std::move(res), keepAlive);
    }

    void write(Response&& res, bool keepAlive = true) {
        res.keep_alive(keepAlive && m_request.keep_alive() && !m_server->stopping);
        res.prepare_payload();
        auto sp = std::make_shared<Response>(std::move(res));
        m_stream.expires_after(
            std::chrono::milliseconds(static_cast<int64_t>(m_server->options.idleTimeoutS * 1000)));
        http::async_write(m_stream, *sp, [self = shared_from_this(), sp](beast::error_code ec, size_t) {
            if (ec || !sp->keep_alive()) return self->close();
            self->m_request = {};
            self->read();
        });
    }

    void close() {
        beast::error_code ec;
        m_stream.socket().shutdown(tcp::socket::shutdown_send, ec);
        m_stream.socket().close(ec);
    }

    beast::tcp_stream m_stream;
    net::steady_timer m_timer;
    bool m_timedOut = false;
    beast::flat_buffer m_buffer;
    std::optional<http::request_parser<http::string_body>> m_parser;
    Request m_request;
    Clock::time_point m_started;
    InferenceServer::Impl* m_server;  // outlives every session: its I/O threads are joined in stop()
};

}  // namespace

void InferenceServer::Impl::accept() {
    acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
        if (stopping || !acceptor->is_open()) return;
        if (!ec) std::make_shared<Session>(std::move(socket), this)->run();
        // EMFILE and the like: keep accepting; the failed connection is simply not served.
        accept();
    });
}

void InferenceServer::Impl::stop() {
    std::lock_guard<std::mutex> lk(stopMutex);
    if (stopped) return;
    stopped = true;
    stopping = true;
    if (acceptor)
        net::post(ioc, [this] {
            beast::error_code ec;
            acceptor->close(ec);
        });
    // Queued requests are answered before the batchers end.
    std::vector<std::shared_ptr<ModelSlot>> slots;
    {
        std::shared_lock<std::shared_mutex> l(modelsMutex);
        for (auto& [n, s] : models) slots.push_back(s);
    }
    for (auto& s : slots) s->batcher->stop();
    {
        std::lock_guard<std::mutex> l(loadersMutex);
        for (auto& t : loaders)
            if (t.joinable()) t.join();
    }
    // A moment for the last answers to be written, then the I/O threads end.
    work.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ioc.stop();
    for (auto& t : threads)
        if (t.joinable()) t.join();
}

InferenceServer::InferenceServer(ServeOptions options) : d(std::make_unique<Impl>()) {
    if (options.maxBatch < 1) throw ConfigError("--max-batch must be at least 1");
    if (options.maxDelayMs < 0) throw ConfigError("--max-delay-ms must be 0 or more");
    if (options.maxQueue < options.maxBatch) throw ConfigError("--max-queue must be at least --max-batch");
    if (options.ioThreads < 1) throw ConfigError("--threads must be at least 1");
    if (options.instances < 1 || options.instances > 64)
        throw ConfigError("--instances must be between 1 and 64");
    if (options.device != "auto" && options.device != "cpu" && options.device != "cuda")
        throw ConfigError("--device '" + options.device + "': use auto, cpu or cuda");
    if (options.optimize != "auto" && options.optimize != "on" && options.optimize != "off")
        throw ConfigError("--optimize '" + options.optimize + "': use auto, on or off");
    if (options.maxBodyBytes < 1024) throw ConfigError("the body limit must be at least 1 KiB");
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

void InferenceServer::load(const ServedModel& model) {
    checkModelName(model.name);
    std::string sha;
    if (model.version > 0 && !d->options.workspace.empty()) {
        Registry registry(d->options.workspace);
        sha = registry.resolve({model.name, model.version, {}}).sha256;
    }
    d->load(model, sha);
}

uint16_t InferenceServer::start() {
    beast::error_code ec;
    const auto address = net::ip::make_address(d->options.host, ec);
    if (ec)
        throw ConfigError("--host '" + d->options.host +
                          "' is not an IP address (use e.g. 127.0.0.1 or 0.0.0.0)");
    const tcp::endpoint ep{address, d->options.port};
    d->acceptor.emplace(d->ioc);
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
    d->work.emplace(d->ioc.get_executor());
    d->accept();
    for (int i = 0; i < d->options.ioThreads; ++i)
        d->threads.emplace_back([impl = d.get()] {
            pthread_setname_np(pthread_self(), "lathe-http");
            // A handler that throws must cost one connection, not the server: Asio lets the
            // exception out of run(), so the thread logs it and goes back in.
            for (;;) {
                try {
                    impl->ioc.run();
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
