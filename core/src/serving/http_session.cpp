// The inference server's HTTP session: Boost.Beast on the connection's event loop, with the KServe v2
// endpoints in one route table (routes()) and their handlers.
#include "http_session.h"

#include <openssl/crypto.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <array>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <string_view>

#include "infer_protocol.h"
#include "lathe/core/error.h"
#include "lathe/core/sha256.h"
#include "server_impl.h"

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace lathe::core::serving {
namespace {

std::string jsonOk(const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void RequestData::clear() {
    method = http::verb::unknown;
    version = 0;
    keepAlive = false;
    target.clear();
    body.clear();
    // A large body (up to --max-body) is not kept for the rest of the connection's life.
    if (body.capacity() > (size_t(1) << 20)) std::string().swap(body);
    authorization.clear();
    inferHeaderLength.clear();
    userId.clear();
    hasAuthorization = hasInferHeaderLength = hasUserId = false;
}

void RequestReader::on_request_impl(http::verb method, beast::string_view, beast::string_view target,
                                    int version, beast::error_code&) {
    m_data.method = method;
    m_data.target.assign(target.data(), target.size());
    m_data.version = static_cast<unsigned>(version);
}

void RequestReader::on_field_impl(http::field name, beast::string_view nameText, beast::string_view value,
                                  beast::error_code&) {
    if (name == http::field::authorization && !m_data.hasAuthorization) {
        m_data.authorization.assign(value.data(), value.size());
        m_data.hasAuthorization = true;
    } else if (name == http::field::unknown && !m_data.hasInferHeaderLength &&
               beast::iequals(nameText, kInferHeaderLength)) {
        m_data.inferHeaderLength.assign(value.data(), value.size());
        m_data.hasInferHeaderLength = true;
    } else if (name == http::field::unknown && !m_data.hasUserId && beast::iequals(nameText, kUserIdHeader)) {
        m_data.userId.assign(value.data(), value.size());
        m_data.hasUserId = true;
    }
}

void RequestReader::on_header_impl(beast::error_code&) { m_data.keepAlive = keep_alive(); }

void RequestReader::on_body_init_impl(const boost::optional<std::uint64_t>& length, beast::error_code&) {
    // Within body_limit, checked before; with simdjson's padding, so the JSON is parsed in place.
    if (length) m_data.body.reserve(static_cast<size_t>(*length) + kJsonPadding);
}

size_t RequestReader::on_body_impl(beast::string_view body, beast::error_code&) {
    m_data.body.append(body.data(), body.size());
    return body.size();
}

size_t RequestReader::on_chunk_body_impl(std::uint64_t, beast::string_view body, beast::error_code&) {
    m_data.body.append(body.data(), body.size());
    return body.size();
}

void AnswerQueue::push(std::shared_ptr<Session> session) {
    std::lock_guard<std::mutex> lk(m_mutex);
    m_pending.push_back(std::move(session));
    if (!m_drainDue) {
        m_drainDue = true;
        m_postDue.store(true, std::memory_order_relaxed);
    }
}

void AnswerQueue::flush() {
    // The batch's first push to this loop set it, unless a drain already on its way will take
    // the batch's answers too; several batch workers may flush at once, one posts.
    if (m_postDue.load(std::memory_order_relaxed) && m_postDue.exchange(false, std::memory_order_acq_rel))
        net::post(m_loop, withMemory(m_memory, [this] { drain(); }));
}

void AnswerQueue::drain() {
    {
        std::lock_guard<std::mutex> lk(m_mutex);
        m_draining.swap(m_pending);
        m_drainDue = false;  // what is pushed from now on needs a post of its own
    }
    for (auto& s : m_draining) s->answer();
    m_draining.clear();  // the sessions are released here, on their loop
}

void AnswerQueue::release() {
    std::lock_guard<std::mutex> lk(m_mutex);
    m_pending.clear();
    m_draining.clear();
}

Session::Session(SessionSocket&& socket, InferenceServer::Impl* server, AnswerQueue* answers)
    : m_socket(std::move(socket)), m_timer(m_socket.get_executor()), m_server(server), m_answers(answers) {}

void Session::run() {
    // Beast reads max(512, free capacity) bytes at a time: with the 512 bytes a new flat_buffer
    // starts with, a 700-byte inference request took two recv calls, every time (the buffer
    // never grew, as each read left it empty). One page takes a typical request in one.
    m_buffer.reserve(4096);
    net::dispatch(m_socket.get_executor(),
                  withMemory(m_memory, [self = shared_from_this()] { self->read(); }));
}

void Session::extendDeadline() {
    m_deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(m_server->options.idleTimeoutS * 1000));
    if (!m_timerArmed) armTimer();
}

void Session::armTimer() {
    m_timerArmed = true;
    m_timer.expires_at(m_deadline);
    m_timer.async_wait(withMemory(m_memory, [self = shared_from_this()](beast::error_code ec) {
        self->m_timerArmed = false;
        // Computing the answer is not the client's delay: left unarmed, the timer is armed
        // again by respond() for the write's deadline (re-arming at a deadline already passed
        // would spin).
        if (ec || self->m_closed || self->m_busy) return;
        if (Clock::now() < self->m_deadline) return self->armTimer();
        self->m_timedOut = true;
        beast::error_code ignored;
        self->m_socket.cancel(ignored);
    }));
}

const RouteTable<Session>& Session::routes() {
    static const RouteTable<Session> table = [] {
        RouteTable<Session> t;
        // Guards, in this order: every /v2/models/NAME/... names a served model, and a version
        // in the path must be the one served (404 otherwise, whatever the rest of the path).
        t.guard("/v2/models/{model}", &Session::resolveModel);
        t.guard("/v2/models/{model}/versions/{version}", &Session::checkVersion);
        // The control API: whatever changes (or lists) what is served is behind the server's
        // token, or open on a loopback-only server without one. Anything added under
        // /v2/repository (unload, rollout control) is gated by this one line.
        t.guard("/v2/repository", &Session::authorizeControl);

        t.add(http::verb::get, "/metrics", &Session::serveMetrics);
        t.add(http::verb::get, "/v2", &Session::serveServerMetadata);
        t.add(http::verb::get, "/v2/health/live", &Session::serveLive);
        t.add(http::verb::get, "/v2/health/ready", &Session::serveReady);
        t.add(http::verb::post, "/v2/repository/index", &Session::serveRepositoryIndex);
        t.add(http::verb::post, "/v2/repository/models/{model}/load", &Session::serveLoad);
        t.add(http::verb::post, "/v2/repository/models/{model}/rollout", &Session::serveRollout);
        t.add(http::verb::get, "/v2/repository/models/{model}/rollout", &Session::serveRolloutState);
        t.add(http::verb::get, "/v2/models/{model}", &Session::serveModelMetadata);
        t.add(http::verb::get, "/v2/models/{model}/versions/{version}", &Session::serveModelMetadata);
        t.add(http::verb::get, "/v2/models/{model}/ready", &Session::serveModelReady);
        t.add(http::verb::get, "/v2/models/{model}/versions/{version}/ready", &Session::serveModelReady);
        t.add(http::verb::post, "/v2/models/{model}/infer", &Session::serveInfer);
        t.add(http::verb::post, "/v2/models/{model}/versions/{version}/infer", &Session::serveInfer);
        return t;
    }();
    return table;
}

void Session::read() {
    if (m_server->stopping) return close();
    m_request.clear();
    m_parser.emplace(m_request);
    m_parser->body_limit(static_cast<uint64_t>(m_server->options.maxBodyBytes));
    m_parser->header_limit(16 * 1024);
    // The whole request must arrive within the idle timeout: a client that stalls mid-request
    // (or trickles bytes) gets 408 instead of holding a connection forever.
    m_timedOut = false;
    extendDeadline();
    http::async_read(m_socket, m_buffer, *m_parser,
                     withMemory(m_memory, [self = shared_from_this()](beast::error_code ec, size_t) {
                         self->onRead(ec);
                     }));
}

void Session::onRead(beast::error_code ec) {
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
            413, "request body is larger than " + std::to_string(m_server->options.maxBodyBytes) + " bytes",
            false);
    if (ec == http::error::header_limit) return sendError(431, "request headers are too large", false);
    if (ec) return sendError(400, std::string("malformed HTTP request: ") + ec.message(), false);
    m_started = Clock::now();
    m_busy = true;  // until respond()
    // A client whose requests outgrow the read buffer (a 1024-float JSON row is 10 KB) gets one
    // that takes the next such request in one recv instead of one per 4 KiB, up to 64 KiB.
    const size_t size = m_request.body.size() + m_request.target.size() + 256;
    if (size > m_buffer.capacity() && m_buffer.capacity() < 64 * 1024)
        m_buffer.reserve(std::min<size_t>(64 * 1024, size + size / 4));
    handle();
}

void Session::handle() {
    std::string_view target(m_request.target);
    if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    const auto result = routes().dispatch(*this, m_request.method, target, m_segments);
    if (result.outcome == RouteOutcome::MethodNotAllowed)
        sendError(405, "use " + methodList(result.allowed) + " for " + std::string(target));
    else if (result.outcome == RouteOutcome::NotFound)
        sendError(404, "no such endpoint: " + std::string(target));
}

bool Session::resolveModel(const RouteParams& p) {
    const std::string& name = p.get("model");
    m_slot = m_server->slot(name);
    m_pinned = Pinned::No;
    if (m_slot) {
        std::lock_guard<std::mutex> lk(m_slot->mutex);
        m_model = m_slot->current;
        if (m_slot->candidate)
            m_candidate = m_slot->candidate;
        else
            m_candidate.reset();
    }
    if (m_model) return true;
    sendError(404, "no model named '" + name + "' is served here");
    return false;
}

bool Session::checkVersion(const RouteParams& p) {
    const std::string& version = p.get("version");
    if (version == std::to_string(m_model->version())) {
        m_pinned = Pinned::Current;
        return true;
    }
    if (m_candidate && version == std::to_string(m_candidate->model->version())) {
        m_model = m_candidate->model;
        m_pinned = Pinned::Candidate;
        return true;
    }
    sendError(
        404, "model '" + p.get("model") + "' version " + version + " is not served (serving version " +
                 std::to_string(m_model->version()) +
                 (m_candidate ? " and, in a rollout, " + std::to_string(m_candidate->model->version()) : "") +
                 ")");
    return false;
}

bool Session::authorizeControl(const RouteParams&) {
    if (m_server->controlTokenSha256.empty()) {
        if (m_server->loopbackOnly) return true;  // local deployments, as before tokens existed
        sendError(403,
                  "the control API (/v2/repository: load, hot swap, unload) needs a token on a server "
                  "that listens beyond loopback (" +
                      m_server->options.host +
                      "), and this one was started without one (lathectl serve: LATHE_SERVER_TOKEN "
                      "or --token-file)");
        return false;
    }
    // `Authorization: Bearer <token>`, the scheme in any case (RFC 9110); the token itself is
    // compared by its SHA-256 in constant time, and never quoted in an answer or a log.
    std::string_view given;
    bool bearer = false;
    if (m_request.hasAuthorization) {
        given = m_request.authorization;
        constexpr std::string_view kScheme = "bearer ";
        bearer = given.size() > kScheme.size() &&
                 std::equal(kScheme.begin(), kScheme.end(), given.begin(),
                            [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
        if (bearer) given.remove_prefix(kScheme.size());
        while (!given.empty() && (given.front() == ' ' || given.front() == '\t')) given.remove_prefix(1);
        while (!given.empty() && (given.back() == ' ' || given.back() == '\t')) given.remove_suffix(1);
    }
    if (!bearer || given.empty()) {
        sendError(401,
                  "the control API (/v2/repository) needs this server's token: send `Authorization: Bearer "
                  "<token>`",
                  true, "WWW-Authenticate: Bearer realm=\"lathe control\"\r\n");
        return false;
    }
    const std::string digest = sha256Hex(given.data(), given.size());
    const auto& want = m_server->controlTokenSha256;
    if (digest.size() != want.size() || CRYPTO_memcmp(digest.data(), want.data(), want.size()) != 0) {
        sendError(403, "the bearer token is not this server's control token");
        return false;
    }
    return true;
}

void Session::serveMetrics(const RouteParams&) {
    m_server->metrics.refreshProcess();
    m_server->gpu.refresh(m_server->metrics);
    prometheus::TextSerializer ser;
    send(200, ser.Serialize(m_server->metrics.registry.Collect()), "text/plain; version=0.0.4");
}

void Session::serveServerMetadata(const RouteParams&) {
    send(200, jsonOk({{"name", "lathe"},
                      {"version", "0.1.0"},
                      {"extensions", {"model_repository", "binary_tensor_data"}},
                      {"instance", m_server->options.instance}}));
}

void Session::serveLive(const RouteParams&) { send(200, jsonOk({{"live", true}})); }

void Session::serveReady(const RouteParams&) {
    bool ready = !m_server->stopping;
    {
        std::shared_lock<std::shared_mutex> lk(m_server->modelsMutex);
        ready = ready && !m_server->models.empty();
    }
    send(ready ? 200 : 503, jsonOk({{"ready", ready}}));
}

void Session::serveRepositoryIndex(const RouteParams&) {
    nlohmann::json a = nlohmann::json::array();
    std::shared_lock<std::shared_mutex> lk(m_server->modelsMutex);
    for (const auto& [name, s] : m_server->models)
        if (auto m = s->get())
            a.push_back({{"name", name}, {"version", std::to_string(m->version())}, {"state", "READY"}});
    send(200, jsonOk(a));
}

void Session::serveLoad(const RouteParams& p) { loadModel(p.get("model")); }

// A server without a registry (started with --file, as a remote deployment is) loads a file
// already on its host: {"parameters": {"version": "3", "path": "/…/model.lathe", "sha256": "…"}}.
// Only through the control API, which beyond loopback needs the deployment's token.
void Session::loadFile(const std::string& name) {
    ServedModel m;
    std::string sha;
    try {
        checkModelName(name);
        m.name = name;
        const auto j = nlohmann::json::parse(m_request.body.empty() ? std::string("{}") : m_request.body);
        const auto params = j.value("parameters", nlohmann::json::object());
        // A path names any file this server's user can read: only the deployment that holds the
        // token may name one (on loopback, other local users could otherwise swap the model).
        if (m_server->controlTokenSha256.empty())
            return sendError(403,
                             "this server was started with --file and without a control token: it loads "
                             "nothing else (start it with --token-file, as lathectl deploy --host does)");
        if (!params.contains("path") || !params.contains("version"))
            return sendError(400,
                             "this server was started with --file and has no registry: a load names the "
                             "artifact's \"path\" on this host, its \"version\" and its \"sha256\"");
        m.path = params.at("path").get<std::string>();
        const auto& v = params["version"];
        m.version = v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
        if (m.version <= 0) throw ConfigError("`version` must be a positive number");
        sha = params.value("sha256", std::string());
        if (sha.size() != 64) throw ConfigError("`sha256` must be the artifact's SHA-256 (64 hex digits)");
    } catch (const std::exception& ex) {
        return sendError(400, std::string("bad load request: ") + ex.what());
    }
    loadInBackground([server = m_server, m, sha] {
        server->load(m, sha);
        return m;
    });
}

// Loading takes seconds: on its own thread, answered on this connection's event loop when done.
// `load` returns what it loaded; its errors answer 404 (no such version), 400 (refused) or 500.
void Session::loadInBackground(std::function<ServedModel()> load) {
    runInBackground([load = std::move(load)] {
        const ServedModel m = load();
        return jsonOk({{"name", m.name}, {"version", std::to_string(m.version)}});
    });
}

// Loading takes seconds: on its own thread, answered on this connection's event loop when done.
// `work` returns the answer's body; its errors answer 404 (no such version), 400 (refused) or 500.
void Session::runInBackground(std::function<std::string()> work) {
    std::lock_guard<std::mutex> lk(m_server->loadersMutex);
    m_server->loaders.emplace_back([self = shared_from_this(), work = std::move(work)] {
        int status = 200;
        std::string body;
        try {
            body = work();
        } catch (const NotFoundError& ex) {
            status = 404;
            body = errorBody(ex.what());
        } catch (const ConfigError& ex) {
            status = 400;
            body = errorBody(ex.what());
        } catch (const std::exception& ex) {
            status = 500;
            body = errorBody(std::string("load failed, the previous version keeps serving: ") + ex.what());
        }
        net::post(self->m_socket.get_executor(),
                  [self, status, body = std::move(body)]() mutable { self->send(status, std::move(body)); });
    });
}

// The rollout of a model, as its state: the version served now, the candidate beside it (0:
// none), the candidate's weight and the request parameter naming users.
static std::string rolloutState(InferenceServer::Impl& server, const std::string& name) {
    const auto slot = server.slot(name);
    if (!slot) throw NotFoundError("no model named '" + name + "' is served here");
    std::shared_ptr<LoadedModel> current;
    std::shared_ptr<const Candidate> c;
    {
        std::lock_guard<std::mutex> lk(slot->mutex);
        current = slot->current;
        c = slot->candidate;
    }
    nlohmann::json j{{"name", name},
                     {"baseline", current ? current->version() : 0},
                     {"candidate", c ? c->source.version : 0},
                     {"weight_bp", c ? c->split.candidateBp : 0},
                     {"user_parameter", c ? c->split.userParameter : std::string()}};
    return jsonOk(j);
}

void Session::serveRolloutState(const RouteParams& p) {
    try {
        send(200, rolloutState(*m_server, p.get("model")));
    } catch (const NotFoundError& ex) {
        sendError(404, ex.what());
    }
}

// POST /v2/repository/models/{model}/rollout, behind the control token:
//   {"candidate": {"version": V}, "weight_bp": N, "user_parameter": "user_id"}  start (or change)
//     (a server started with --file names the candidate's "path" and "sha256" there too)
//   {"weight_bp": N}                                                             reweigh
//   {"end": "abort" | "promote"}                                                 end
// Answers the rollout's state once done (loading a candidate takes seconds).
void Session::serveRollout(const RouteParams& p) {
    const std::string name = p.get("model");
    std::function<std::string()> work;
    try {
        checkModelName(name);
        const auto j = nlohmann::json::parse(m_request.body.empty() ? std::string("{}") : m_request.body);
        if (!j.is_object()) throw ConfigError("the body must be a JSON object");
        auto weightOf = [&]() -> int32_t {
            const auto& w = j.at("weight_bp");
            if (!w.is_number_integer()) throw ConfigError("`weight_bp` must be an integer from 0 to 10000");
            const auto v = w.get<int64_t>();
            if (v < 0 || v > serving::kBasisPoints)
                throw ConfigError("`weight_bp` must be from 0 to 10000 (basis points), got " +
                                  std::to_string(v));
            return static_cast<int32_t>(v);
        };
        if (j.contains("end")) {
            if (!j["end"].is_string()) throw ConfigError("`end` must be \"abort\" or \"promote\"");
            const std::string how = j["end"].get<std::string>();
            work = [server = m_server, name, how] {
                server->endRollout(name, how);
                return rolloutState(*server, name);
            };
        } else if (j.contains("candidate")) {
            const auto& c = j["candidate"];
            if (!c.is_object() || !c.contains("version") || !c["version"].is_number_integer())
                throw ConfigError("`candidate` must be an object with the candidate's integer `version`");
            ServedModel m;
            m.name = name;
            m.version = c["version"].get<int64_t>();
            if (m.version <= 0) throw ConfigError("the candidate's `version` must be a positive number");
            std::string sha;
            const bool fromFile = m_server->options.workspace.empty();
            if (fromFile) {
                if (m_server->controlTokenSha256.empty())
                    return sendError(403,
                                     "this server was started with --file and without a control token: it "
                                     "loads nothing else (start it with --token-file, as lathectl deploy "
                                     "--host does)");
                if (!c.contains("path") || !c["path"].is_string() || !c.contains("sha256") ||
                    !c["sha256"].is_string() || c["sha256"].get<std::string>().size() != 64)
                    throw ConfigError(
                        "this server has no registry: the candidate names the artifact's \"path\" on this "
                        "host "
                        "and its \"sha256\" (64 hex digits)");
                m.path = c["path"].get<std::string>();
                sha = c["sha256"].get<std::string>();
            }
            serving::TrafficSplit split;
            split.candidateBp = j.contains("weight_bp") ? weightOf() : 0;
            if (j.contains("user_parameter")) {
                if (!j["user_parameter"].is_string()) throw ConfigError("`user_parameter` must be a string");
                split.userParameter = j["user_parameter"].get<std::string>();
                if (split.userParameter.size() > 64)
                    throw ConfigError("`user_parameter` must be a parameter's name (at most 64 characters)");
            }
            work = [server = m_server, m, sha, split]() mutable {
                if (!server->options.workspace.empty()) {
                    Registry registry(server->options.workspace);
                    const auto v = registry.resolve({m.name, m.version, {}});
                    m.path = v.path;
                    sha = v.sha256;
                }
                server->startRollout(m, sha, split);
                return rolloutState(*server, m.name);
            };
        } else if (j.contains("weight_bp")) {
            const int32_t bp = weightOf();
            work = [server = m_server, name, bp] {
                server->setRolloutWeight(name, bp);
                return rolloutState(*server, name);
            };
        } else {
            throw ConfigError(
                "say what to do: {\"candidate\": {\"version\": V}, \"weight_bp\": N} starts a rollout, "
                "{\"weight_bp\": N} reweighs it, {\"end\": \"abort\"|\"promote\"} ends it");
        }
    } catch (const std::exception& ex) {
        return sendError(400, std::string("bad rollout request: ") + ex.what());
    }
    runInBackground(std::move(work));
}

void Session::serveModelMetadata(const RouteParams& p) {
    send(200, modelMetadata(p.get("model"), m_model->version(), m_model->signature()));
}

void Session::serveModelReady(const RouteParams& p) {
    send(200, jsonOk({{"name", p.get("model")}, {"ready", true}}));
}

void Session::serveInfer(const RouteParams&) { infer(); }

const Metrics::PerVersion& Session::metricsOf(const LoadedModel& model) {
    if (model.version() != m_metricsVersion || model.name() != m_metricsName) {
        m_pv = m_server->metrics.of(model.name(), model.version());
        m_ok = m_server->metrics.counter(model.name(), model.version(), 200);
        m_metricsName = model.name();
        m_metricsVersion = model.version();
    }
    return m_pv;
}

void Session::countAnswer(const LoadedModel& model, int status) {
    if (status == 200) {
        metricsOf(model);
        m_ok->Increment();
    } else {
        m_server->metrics.count(model.name(), model.version(), status);
    }
}

void Session::infer() {
    const LoadedModel& model = *m_model;
    const bool split = m_candidate && m_pinned == Pinned::No;
    ProtocolError err;
    // Into the session's buffer: its capacity is kept from one request to the next. (A candidate
    // takes the same tensors as the current version: the rollout checked it.)
    if (!parseInferRequest(m_request.body, model.signature(), model.maxBatch(), m_infer, err,
                           m_request.hasInferHeaderLength
                               ? std::optional<std::string_view>(m_request.inferHeaderLength)
                               : std::nullopt,
                           m_request.body.capacity(),
                           split ? std::string_view(m_candidate->split.userParameter) : std::string_view())) {
        countAnswer(model, err.status);
        return sendError(err.status, err.message);
    }
    Batcher* batcher = m_slot->batcher.get();
    if (m_pinned == Pinned::Candidate) {
        batcher = m_candidate->batcher.get();
    } else if (split) {
        // The rollout's parameter names the user when the request has it, else X-User-Id; a
        // request with neither goes at random, counted apart.
        const std::string_view user = !m_infer.userId.empty() ? std::string_view(m_infer.userId)
                                      : m_request.hasUserId   ? std::string_view(m_request.userId)
                                                              : std::string_view();
        const bool candidateGets =
            toCandidate(m_candidate->split, model.name(), user, user.empty() ? splitDraw() : 0);
        m_candidate->routed[candidateGets][!user.empty()]->Increment();
        if (candidateGets) {
            m_model = m_candidate->model;
            batcher = m_candidate->batcher.get();
        }
    }
    PendingRequest p;
    p.model = m_model;
    p.rows = m_infer.rows;
    p.input = m_infer.data.data();  // read by the batcher before batchDone; not touched here until then
    p.enqueued = Clock::now();
    p.client = shared_from_this();
    if (!batcher->submit(std::move(p))) {
        countAnswer(*m_model, 503);
        return sendError(503,
                         "server overloaded: the request queue is full (--max-queue " +
                             std::to_string(m_server->options.maxQueue) + " rows); retry later",
                         true, "Retry-After: 1\r\n");
    }
}

void Session::batchDone(const BatchResult& result, const float* output, int64_t count) {
    // On the batcher thread: copy this request's rows out of the batch (whose buffer the next
    // batch reuses), then back onto this connection's event loop: the batcher must not touch the
    // socket, and JSON encoding belongs on the I/O threads, not in the batch loop.
    m_result = result;
    if (output) m_output.assign(output, output + count);
    m_answers->push(shared_from_this());
}

void Session::batchFlush() { m_answers->flush(); }

void Session::answer() {
    const auto keep = m_model;  // respond() releases m_model
    const LoadedModel& model = *keep;
    countAnswer(model, m_result.status);
    if (m_result.status != 200) return sendError(m_result.status, m_result.error);
    const auto& pv = metricsOf(model);
    pv.queue->Observe(m_result.queueS);
    const int64_t jsonLength =
        inferResponseInto(m_body, model.name(), model.version(), m_infer.id, model.signature().outputs[0],
                          m_infer.rows, m_output.data(), model.outputElems(), m_infer.binaryOutput);
    // Which version answered, also in the JSON's model_version: during a rollout the client
    // cannot know otherwise (and a binary answer has no JSON field to look at first).
    const int n = std::snprintf(m_versionHeader, sizeof m_versionHeader, "X-Model-Version: %lld\r\n",
                                static_cast<long long>(model.version()));
    respond(200, jsonLength < 0 ? "application/json" : "application/octet-stream", jsonLength,
            std::string_view(m_versionHeader, static_cast<size_t>(std::max(0, n))), true);
    pv.latency->Observe(std::chrono::duration<double>(Clock::now() - m_started).count());
}

void Session::loadModel(const std::string& name) {
    if (m_server->options.workspace.empty()) return loadFile(name);
    ModelRef ref;
    try {
        checkModelName(name);
        ref.name = name;
        const auto j = nlohmann::json::parse(m_request.body.empty() ? std::string("{}") : m_request.body);
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
    loadInBackground([server = m_server, ref] {
        Registry registry(server->options.workspace);
        const auto v = registry.resolve(ref);
        const ServedModel m{ref.name, v.version, v.path};
        server->load(m, v.sha256);
        return m;
    });
}

void Session::send(int status, std::string body, const char* type, int64_t jsonLength) {
    m_body = std::move(body);
    respond(status, type, jsonLength, {}, true);
}

void Session::sendError(int status, const std::string& message, bool keepAlive,
                        std::string_view extraHeaders) {
    m_body = errorBody(message);
    respond(status, "application/json", -1, extraHeaders, keepAlive);
}

void Session::respond(int status, const char* type, int64_t jsonLength, std::string_view extraHeaders,
                      bool keepAlive) {
    // The answer to this request is on its way: nothing else of it is needed, and an idle
    // connection must not keep an old model version alive.
    m_busy = false;
    m_slot.reset();
    m_model.reset();
    m_candidate.reset();
    const unsigned version = m_request.version ? m_request.version : 11;
    keepAlive = keepAlive && m_request.keepAlive && !m_server->stopping;
    // The status line and headers Beast would write, formatted into a buffer that keeps its
    // capacity: "HTTP/1.1 200 OK", Server, Content-Type, Content-Length, and Connection where
    // the version's default is not what happens.
    const auto reason = http::obsolete_reason(static_cast<http::status>(status));
    m_head.assign(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ");
    char num[24];
    auto put = [&](int64_t v) {
        const auto [end, ec] = std::to_chars(num, num + sizeof num, v);
        m_head.append(num, end);
    };
    put(status);
    m_head += ' ';
    m_head.append(reason.data(), reason.size());
    m_head += "\r\nServer: lathe\r\nContent-Type: ";
    m_head += type;
    m_head += "\r\nContent-Length: ";
    put(static_cast<int64_t>(m_body.size()));
    m_head += "\r\n";
    if (jsonLength >= 0) {
        m_head += kInferHeaderLength;
        m_head += ": ";
        put(jsonLength);
        m_head += "\r\n";
    }
    m_head.append(extraHeaders.data(), extraHeaders.size());
    if (version == 10 && keepAlive) m_head += "Connection: keep-alive\r\n";
    if (version != 10 && !keepAlive) m_head += "Connection: close\r\n";
    m_head += "\r\n";
    // A client that stops reading gets the idle timeout to take the answer.
    extendDeadline();
    const std::array<net::const_buffer, 2> buffers{net::buffer(m_head), net::buffer(m_body)};
    net::async_write(
        m_socket, buffers,
        withMemory(m_memory, [self = shared_from_this(), keepAlive](beast::error_code ec, size_t) {
            if (ec || !keepAlive) return self->close();
            self->trimBuffers();
            self->read();
        }));
}

void Session::trimBuffers() {
    // A connection keeps its buffers' capacity between requests, but not that of one huge
    // request (up to --max-body) for the rest of its life.
    constexpr size_t kKeep = size_t(1) << 20;
    if (m_body.capacity() > kKeep) std::string().swap(m_body);
    if (m_infer.data.capacity() * sizeof(float) > kKeep) std::vector<float>().swap(m_infer.data);
    if (m_output.capacity() * sizeof(float) > kKeep) std::vector<float>().swap(m_output);
    if (m_buffer.capacity() > 64 * 1024 && m_buffer.size() == 0) {
        m_buffer.shrink_to_fit();
        m_buffer.reserve(4096);
    }
}

void Session::close() {
    m_closed = true;
    m_slot.reset();
    m_model.reset();
    m_candidate.reset();
    beast::error_code ec;
    m_socket.shutdown(tcp::socket::shutdown_send, ec);
    m_socket.close(ec);
    m_timer.cancel();
}

}  // namespace lathe::core::serving
