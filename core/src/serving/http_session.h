#pragma once
// One HTTP/1.1 connection of the inference server: reads requests (with the body, header and
// time limits), routes them through the route table (routes.h) to the KServe v2 handlers, and
// writes the answers, keep-alive, all on the connection's strand.
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "batcher.h"
#include "lathe/core/server.h"
#include "routes.h"

namespace lathe::core::serving {

struct ModelSlot;

class Session : public std::enable_shared_from_this<Session> {
public:
    /// `server` outlives every session: its I/O threads are joined in stop().
    Session(boost::asio::ip::tcp::socket&& socket, InferenceServer::Impl* server);

    void run();

private:
    using Request = boost::beast::http::request<boost::beast::http::string_body>;
    using Response = boost::beast::http::response<boost::beast::http::string_body>;

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

    void infer(const std::shared_ptr<ModelSlot>& slot, std::shared_ptr<LoadedModel> model);
    void answer(const LoadedModel& model, const std::string& id, int64_t rows, bool binary, BatchResult& r);
    void loadModel(const std::string& name);
    void loadFile(const std::string& name);
    void loadInBackground(std::function<ServedModel()> load);

    // `jsonLength` >= 0: a binary tensor data body, whose JSON part is that long.
    void send(int status, std::string body, const char* type = "application/json", int64_t jsonLength = -1);
    void sendError(int status, const std::string& message, bool keepAlive = true);
    void write(Response&& res, bool keepAlive = true);
    void close();

    boost::beast::tcp_stream m_stream;
    boost::asio::steady_timer m_timer;
    bool m_timedOut = false;
    boost::beast::flat_buffer m_buffer;
    std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> m_parser;
    Request m_request;
    Clock::time_point m_started;
    InferenceServer::Impl* m_server;  // outlives every session: its I/O threads are joined in stop()
    // The model a /v2/models/{model}/... request names, resolved once by resolveModel() so the
    // version check and the answer see the same version across a hot swap; released when
    // handle() returns, so an idle connection does not keep an old version alive.
    std::shared_ptr<ModelSlot> m_slot;
    std::shared_ptr<LoadedModel> m_model;
};

}  // namespace lathe::core::serving
