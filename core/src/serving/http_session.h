#pragma once
// One HTTP/1.1 connection of the inference server: reads requests (with the body, header and
// time limits), routes them through the route table (routes.h) to the KServe v2 handlers, and
// writes the answers, keep-alive, all on the connection's event loop (one thread).
//
// The request path is the server's cost per request, so it allocates nothing once a connection
// is warm: the request's floats, the answer's bytes and the route's path segments live in
// buffers of the session that keep their capacity; answers are written as two buffers (a header
// formatted here, the body) instead of a Beast message; one timer per connection, re-armed only
// when it fires, enforces the idle and request timeouts (arming and cancelling one around every
// request cost two timer-queue updates each); metric children are looked up once per model
// version, not per request; the batcher tells the session through BatchClient, not a
// std::function; Asio's operation objects live in the session's HandlerMemory.
#include <atomic>
#include <boost/asio/basic_stream_socket.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "batcher.h"
#include "handler_memory.h"
#include "infer_protocol.h"
#include "lathe/core/server.h"
#include "routes.h"
#include "server_metrics.h"

namespace lathe::core::serving {

struct ModelSlot;
struct Candidate;

/// A connection's executor and socket: concrete types, so no handler goes through Asio's
/// type-erased any_io_executor (its copies and queries showed up at ~5% of a saturated server).
/// The executor is its event loop's: one thread runs each loop, so a connection's handlers never
/// run concurrently without a strand (server_impl.h).
using SessionExecutor = boost::asio::io_context::executor_type;
using SessionSocket = boost::asio::basic_stream_socket<boost::asio::ip::tcp, SessionExecutor>;

/// What the server keeps of a request: strings that keep their capacity from one request to the
/// next on a connection.
struct RequestData {
    boost::beast::http::verb method = boost::beast::http::verb::unknown;
    unsigned version = 0;  // 10 or 11; 0 before a request line was read
    bool keepAlive = false;
    std::string target, body;
    std::string authorization, inferHeaderLength, userId;  // the fields' values (X-User-Id)
    bool hasAuthorization = false, hasInferHeaderLength = false, hasUserId = false;
    void clear();
};

/// Beast's HTTP parser (limits, chunked bodies, keep-alive rules) filling a RequestData instead
/// of a request message, whose fields and body would be allocated afresh for every request.
class RequestReader : public boost::beast::http::basic_parser<true> {
public:
    explicit RequestReader(RequestData& data) : m_data(data) {}

private:
    void on_request_impl(boost::beast::http::verb method, boost::beast::string_view methodText,
                         boost::beast::string_view target, int version,
                         boost::beast::error_code& ec) override;
    void on_response_impl(int, boost::beast::string_view, int, boost::beast::error_code&) override {}
    void on_field_impl(boost::beast::http::field name, boost::beast::string_view nameText,
                       boost::beast::string_view value, boost::beast::error_code& ec) override;
    void on_header_impl(boost::beast::error_code& ec) override;
    void on_body_init_impl(const boost::optional<std::uint64_t>& length,
                           boost::beast::error_code& ec) override;
    size_t on_body_impl(boost::beast::string_view body, boost::beast::error_code& ec) override;
    void on_chunk_header_impl(std::uint64_t, boost::beast::string_view, boost::beast::error_code&) override {}
    size_t on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                              boost::beast::error_code& ec) override;
    void on_finish_impl(boost::beast::error_code&) override {}

    RequestData& m_data;
};

class Session;

/// The answers of finished batches on their way to one event loop. A batch of 32 answered by 32
/// posts cost 32 locks of the loop's queue, each contended by the loop itself, and a wake-up
/// whenever the loop had gone idle in between; here the batcher hands over a batch's answers for
/// this loop under its own lock and posts once, and the loop answers them all in one handler.
class AnswerQueue {
public:
    explicit AnswerQueue(boost::asio::io_context& loop) : m_loop(loop) {}
    AnswerQueue(const AnswerQueue&) = delete;
    AnswerQueue& operator=(const AnswerQueue&) = delete;

    /// Batcher thread: `session` is answered on the loop after the next flush().
    void push(std::shared_ptr<Session> session);
    /// Batcher thread, after a batch's pushes: posts the loop's handler unless one is on its way.
    void flush();
    /// After the loop has stopped: lets go of the sessions never answered.
    void release();

private:
    void drain();  // on the loop

    boost::asio::io_context& m_loop;
    std::mutex m_mutex;
    std::vector<std::shared_ptr<Session>> m_pending;   // under m_mutex
    std::vector<std::shared_ptr<Session>> m_draining;  // the loop's, keeps its capacity
    bool m_drainDue = false;  // under m_mutex: a drain is posted or will be at the next flush
    std::atomic<bool> m_postDue{false};
    HandlerMemory m_memory;  // one drain is posted at a time
};

class Session : public BatchClient, public std::enable_shared_from_this<Session> {
public:
    /// `server` outlives every session: its I/O threads are joined in stop(). `answers`: the
    /// queue of the loop that runs this session, which outlives it too.
    Session(SessionSocket&& socket, InferenceServer::Impl* server, AnswerQueue* answers);

    void run();

    /// BatchClient: on the batcher thread; the answer is written on this connection's event loop.
    void batchDone(const BatchResult& result, const float* output, int64_t count) override;
    void batchFlush() override;
    /// On the loop, from AnswerQueue: writes the answer batchDone left.
    void answer();

private:
    /// The endpoints, built once (add one here; routes.h says how).
    static const RouteTable<Session>& routes();

    void read();
    void onRead(boost::beast::error_code ec);
    void handle();

    // Guards and handlers of the route table.
    bool resolveModel(const RouteParams& p);
    bool checkVersion(const RouteParams& p);
    bool authorizeControl(const RouteParams& p);
    void serveMetrics(const RouteParams& p);
    void serveServerMetadata(const RouteParams& p);
    void serveLive(const RouteParams& p);
    void serveReady(const RouteParams& p);
    void serveRepositoryIndex(const RouteParams& p);
    void serveLoad(const RouteParams& p);
    void serveModelMetadata(const RouteParams& p);
    void serveModelReady(const RouteParams& p);
    void serveInfer(const RouteParams& p);

    void infer();
    void loadModel(const std::string& name);
    void loadFile(const std::string& name);
    void loadInBackground(std::function<ServedModel()> load);
    void runInBackground(std::function<std::string()> work);
    void serveRollout(const RouteParams& p);
    void serveRolloutState(const RouteParams& p);

    // Answers. `extraHeaders`: whole "Name: value\r\n" lines. `jsonLength` >= 0: a binary tensor
    // data body whose JSON part is that long. The body is written from m_body.
    void send(int status, std::string body, const char* type = "application/json", int64_t jsonLength = -1);
    void sendError(int status, const std::string& message, bool keepAlive = true,
                   std::string_view extraHeaders = {});
    void respond(int status, const char* type, int64_t jsonLength, std::string_view extraHeaders,
                 bool keepAlive);
    void close();
    void trimBuffers();

    // The connection's one timer: `m_deadline` moves on with every request; the timer, when it
    // fires, either finds the deadline passed (and cancels the socket) or waits again for it.
    void extendDeadline();
    void armTimer();

    /// The metric children of this model version, looked up once per version on this connection.
    const Metrics::PerVersion& metricsOf(const LoadedModel& model);
    void countAnswer(const LoadedModel& model, int status);

    HandlerMemory m_memory;  // for Asio's operations on this connection: first, so it is freed last
    SessionSocket m_socket;
    boost::asio::basic_waitable_timer<Clock, boost::asio::wait_traits<Clock>, SessionExecutor> m_timer;
    Clock::time_point m_deadline;
    bool m_timerArmed = false;
    bool m_busy = false;  // a request is being answered (computed, loaded): no timeout meanwhile
    bool m_timedOut = false;
    bool m_closed = false;
    boost::beast::flat_buffer m_buffer;
    std::optional<RequestReader> m_parser;
    RequestData m_request;
    Clock::time_point m_started;
    InferenceServer::Impl* m_server;  // outlives every session: its I/O threads are joined in stop()
    AnswerQueue* m_answers;
    // The model a /v2/models/{model}/... request names, resolved once by resolveModel() so the
    // version check and the answer see the same version across a hot swap; released when the
    // answer is written, so an idle connection does not keep an old version alive.
    std::shared_ptr<ModelSlot> m_slot;
    std::shared_ptr<LoadedModel> m_model;
    // During a rollout: the candidate as it was when the request was resolved (null otherwise),
    // and whether the request's path named a version (then the split does not apply).
    std::shared_ptr<const Candidate> m_candidate;
    enum class Pinned { No, Current, Candidate } m_pinned = Pinned::No;
    char m_versionHeader[48] = {};        // "X-Model-Version: N\r\n" of the answer
    std::vector<std::string> m_segments;  // the path's, reused by the route table

    // The request in flight to the batcher (one at a time per connection) and its answer.
    InferRequest m_infer;
    BatchResult m_result;
    std::vector<float> m_output;
    // What is being written: the status line and headers, and the body.
    std::string m_head, m_body;

    // Metric children of the model version last answered on this connection.
    std::string m_metricsName;
    int64_t m_metricsVersion = -1;
    Metrics::PerVersion m_pv{};
    prometheus::Counter* m_ok = nullptr;
};

}  // namespace lathe::core::serving
