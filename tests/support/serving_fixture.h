#pragma once
// Serving tests' common ground: a workspace with a registered "digits" model (a digits MLP
// trained for a couple of epochs through the core API), a real InferenceServer on a free
// loopback port serving it, and a small blocking HTTP client for checking the server by hand.
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "lathe/core/http_client.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/record.h"
#include "lathe/core/registry.h"
#include "lathe/core/server.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "temp_dir.h"

namespace lathe::test {

/// A workspace (in its own temporary directory) holding one trained run of the digits MLP,
/// registered as model "digits" version 1.
class ServingWorkspace {
public:
    /// `hidden`: the MLP's hidden widths (empty: the default spec's).
    explicit ServingWorkspace(int64_t epochs = 2, std::vector<int64_t> hidden = {})
        : m_db(m_dir.file("ws/lathe.db")) {
        core::Store store(m_db);
        core::RunSpec spec;
        spec.epochs = epochs;
        if (!hidden.empty()) spec.hidden = std::move(hidden);
        const auto rec = core::trainAndRecord(store, spec, {});
        if (rec.result.status != lathe::core::RunStatus::Completed)
            throw std::runtime_error("serving fixture: training failed: " + rec.result.error);
        m_runId = rec.runId;
        store.flush();
        core::Registry registry(m_db);
        m_version = core::registerModel(registry, &store, "digits", m_runId, "", {});
    }

    const std::string& db() const { return m_db; }
    int64_t runId() const { return m_runId; }
    const core::ModelVersion& version() const {
        return m_version;
    }  // digits v1: input [-1, 64], output [-1, 10]
    /// The same MLP trained again for one epoch with another seed (other weights, as healthy as
    /// v1), registered as the next version of "digits"; returns that version.
    core::ModelVersion registerOtherWeights() const {
        core::Store store(m_db);
        core::RunSpec spec;
        spec.epochs = 1;
        spec.seed = 11;
        const auto rec = core::trainAndRecord(store, spec, {});
        if (rec.result.status != lathe::core::RunStatus::Completed)
            throw std::runtime_error("serving fixture: training failed: " + rec.result.error);
        store.flush();
        core::Registry registry(m_db);
        return core::registerModel(registry, &store, "digits", rec.runId, "", {});
    }

    const TempDir& dir() const { return m_dir; }
    std::string file(const std::string& name) const { return m_dir.file(name); }

    /// A started server (port 0: any free port) serving digits v1 under `options`.
    std::unique_ptr<core::InferenceServer> serve(core::ServeOptions options = {}) const {
        options.port = 0;
        options.workspace = m_db;
        auto server = std::make_unique<core::InferenceServer>(options);
        server->load({"digits", m_version.version, m_version.path});
        server->start();
        return server;
    }

private:
    TempDir m_dir;
    std::string m_db;
    int64_t m_runId = 0;
    core::ModelVersion m_version;
};

inline std::string localUrl(uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

struct HttpAnswer {
    int status = 0;  // 0: no answer (see error)
    std::string body;
    std::string error;
    std::map<std::string, std::string> headers;  // names in lower case
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

/// One blocking request to 127.0.0.1:port with a deadline; never throws. `headers` are added
/// to (or replace) the request's own.
inline HttpAnswer httpRequest(uint16_t port, const std::string& method, const std::string& target,
                              const std::string& body = {}, double timeoutS = 5,
                              const HttpHeaders& headers = {}) {
    namespace beast = boost::beast;
    namespace http = beast::http;
    namespace asio = boost::asio;
    asio::io_context ioc;
    beast::tcp_stream stream(ioc);
    beast::flat_buffer buffer;
    http::request<http::string_body> req{http::string_to_verb(method), target, 11};
    req.set(http::field::host, "127.0.0.1:" + std::to_string(port));
    req.set(http::field::connection, "close");
    if (!body.empty()) {
        req.set(http::field::content_type, "application/json");
        req.body() = body;
    }
    for (const auto& [name, value] : headers) req.set(name, value);
    req.prepare_payload();
    http::response<http::string_body> res;
    HttpAnswer a;
    stream.expires_after(std::chrono::milliseconds(static_cast<int64_t>(timeoutS * 1000)));
    stream.async_connect(
        asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), [&](beast::error_code ec) {
            if (ec) {
                a.error = "connect: " + ec.message();
                return;
            }
            http::async_write(stream, req, [&](beast::error_code ec2, size_t) {
                if (ec2) {
                    a.error = "write: " + ec2.message();
                    return;
                }
                http::async_read(stream, buffer, res, [&](beast::error_code ec3, size_t) {
                    if (ec3) {
                        a.error = "read: " + ec3.message();
                        return;
                    }
                    a.status = static_cast<int>(res.result_int());
                    a.body = res.body();
                    for (const auto& f : res) {
                        std::string name(f.name_string());
                        for (auto& c : name)
                            c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
                        a.headers[name] = std::string(f.value());
                    }
                });
            });
        });
    ioc.run();
    return a;
}

inline HttpAnswer httpGet(uint16_t port, const std::string& target) {
    return httpRequest(port, "GET", target);
}

}  // namespace lathe::test
