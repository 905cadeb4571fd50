// The request path allocates nothing once a connection is warm (issue 17: "no per-request heap
// allocation on the hot path"). This program replaces the global operator new and counts, while
// a window is open, the allocations made on the server's I/O threads (named lathe-http). It is a
// program of its own so that the replacement touches no other test. The batcher thread is not
// counted: LibTorch allocates its tensors per batch, and these requests are one batch each.
#include <sys/prctl.h>
#include <algorithm>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "serving_fixture.h"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<long> g_ioAllocations{0};

void countAllocation() {
    if (!g_counting.load(std::memory_order_relaxed)) return;
    char name[17] = {};
    prctl(PR_GET_NAME, name);
    if (std::strncmp(name, "lathe-http", 10) == 0) g_ioAllocations.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void* operator new(size_t n) {
    countAllocation();
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new(size_t n, const std::nothrow_t&) noexcept {
    countAllocation();
    return std::malloc(n ? n : 1);
}
void* operator new(size_t n, std::align_val_t a) {
    countAllocation();
    const size_t align = static_cast<size_t>(a);
    if (void* p = std::aligned_alloc(align, (std::max<size_t>(n, 1) + align - 1) / align * align)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;

// One keep-alive connection sending requests one after another, as a client library does.
class KeepAliveClient {
public:
    explicit KeepAliveClient(uint16_t port) : m_socket(m_ioc) {
        m_socket.connect({net::ip::make_address("127.0.0.1"), port});
    }
    // Returns the status; `body` gets the answer's body.
    int post(const std::string& request, std::string& body) {
        net::write(m_socket, net::buffer(request));
        http::response<http::string_body> res;
        http::read(m_socket, m_buffer, res);
        body = res.body();
        return static_cast<int>(res.result_int());
    }

private:
    net::io_context m_ioc;
    net::ip::tcp::socket m_socket;
    beast::flat_buffer m_buffer;
};

std::string rawRequest(const std::string& body, const std::string& extraHeaders) {
    return "POST /v2/models/digits/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
           extraHeaders + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace

TEST_CASE("a warm connection's requests allocate nothing on the server's I/O threads", "[serving]") {
    lathe::test::ServingWorkspace ws(1);
    auto server = ws.serve();
    KeepAliveClient client(server->port());

    // JSON with an id longer than a short string's inline buffer, and binary tensor data.
    std::string data;
    for (int i = 0; i < 64; ++i) data += (i ? "," : "") + std::to_string(0.01 * i);
    const std::string json =
        rawRequest(R"({"id":"a-request-id-longer-than-sixteen","inputs":[{"name":"input","shape":[1,1,8,8],)"
                   R"("datatype":"FP32","data":[)" +
                       data + "]}]}",
                   "");
    std::string binBody =
        R"({"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","parameters":{"binary_data_size":256}}],)"
        R"("parameters":{"binary_data_output":true}})";
    const auto jsonLength = binBody.size();
    std::vector<float> x(64, 0.5f);
    binBody.append(reinterpret_cast<const char*>(x.data()), 256);
    const std::string binary =
        rawRequest(binBody, "Inference-Header-Content-Length: " + std::to_string(jsonLength) + "\r\n");

    std::string answer;
    for (int i = 0; i < 30; ++i) {  // warm: buffers reach their sizes, metric children are looked up
        REQUIRE(client.post(json, answer) == 200);
        REQUIRE(client.post(binary, answer) == 200);
    }
    REQUIRE(answer.size() > 40);

    constexpr int kRequests = 200;
    int ok = 0;
    g_ioAllocations = 0;
    g_counting = true;
    for (int i = 0; i < kRequests; ++i) {
        ok += client.post(json, answer) == 200;
        ok += client.post(binary, answer) == 200;
    }
    g_counting = false;
    CHECK(ok == 2 * kRequests);
    INFO("allocations on the I/O threads during " << 2 * kRequests << " requests");
    CHECK(g_ioAllocations.load() == 0);

    // The counter counts: a request on a new connection allocates (its session, its buffers).
    g_counting = true;
    {
        KeepAliveClient fresh(server->port());
        CHECK(fresh.post(json, answer) == 200);
    }
    g_counting = false;
    CHECK(g_ioAllocations.load() > 0);
}
