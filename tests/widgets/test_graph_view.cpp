// The Graph view on a model no one here wrote: torchvision's ResNet-18 exported to ONNX by
// Debian's python3-torch at test time, read and laid out off the GUI thread, drawn offscreen
// (screenshots kept in test-output/), searched, clicked, collapsed and expanded, turned
// horizontal, exported; a large synthetic graph opening collapsed; the heat map from op times.
#include <catch2/catch.hpp>

#include <QFile>
#include <QLineEdit>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>
#include <QTextBrowser>
#include <QToolButton>

#include <cstdlib>

#include "lathe/core/graph_layout.h"
#include "lathe/widgets/graph_view.h"
#include "test_helpers.h"

using lathe::test::outputPath;
using lathe::test::waitUntil;
using lathe::widgets::GraphView;
namespace core = lathe::core;

namespace {

// Waits for the next layout to be on screen.
bool waitForLayout(GraphView& view, QSignalSpy& spy, int timeoutMs = 120000) {
    const int before = spy.count();
    return waitUntil([&] { return spy.count() > before; }, timeoutMs);
}

QString exportResnet(const QTemporaryDir& dir) {
    const QString path = dir.filePath(QStringLiteral("resnet18.onnx"));
    const std::string cmd =
        "/usr/bin/python3 -c \"import torch, torchvision, warnings; warnings.simplefilter('ignore'); "
        "m = torchvision.models.resnet18(weights=None); "
        "torch.onnx.export(m, torch.rand(1, 3, 224, 224), '" +
        path.toStdString() +
        "', opset_version=14, do_constant_folding=False, training=torch.onnx.TrainingMode.PRESERVE)\" "
        ">/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0 ? path : QString();
}

}  // namespace

TEST_CASE("Graph view: ResNet-18 from ONNX drawn, searched, clicked, collapsed, exported",
          "[widgets][graph]") {
    if (std::system("/usr/bin/python3 -c 'import torch, torchvision' >/dev/null 2>&1") != 0) {
        WARN("skipped: Debian's python3-torch and python3-torchvision are not installed");
        return;
    }
    QTemporaryDir dir;
    const QString file = exportResnet(dir);
    REQUIRE(!file.isEmpty());

    GraphView view;
    view.resize(1400, 900);
    view.show();
    QSignalSpy ready(&view, &GraphView::layoutReady);
    QSignalSpy failed(&view, &GraphView::loadFailed);
    view.openFile(file, QStringLiteral("ResNet-18"));
    REQUIRE(waitForLayout(view, ready));
    CHECK(failed.isEmpty());
    REQUIRE(view.graph() != nullptr);
    CHECK(view.graph()->parameters == 11689512);
    CHECK(view.visibleBoxes() == 71);  // small enough to open with every op shown
    CHECK(view.collapsedScopes().empty());
    REQUIRE(view.grab().save(outputPath("graph_view_resnet18.png")));

    // Search (what Ctrl+F focuses) finds a node by name; the properties panel shows its shapes.
    auto* search = view.findChild<QLineEdit*>(QStringLiteral("graphSearch"));
    REQUIRE(search != nullptr);
    search->setText(QStringLiteral("layer2.0.conv1"));
    QTest::keyClick(search, Qt::Key_Return);
    REQUIRE(view.selectedNode() >= 0);
    CHECK(view.graph()->nodes[static_cast<size_t>(view.selectedNode())].name == "layer2.0.conv1");
    const QString props = view.propertiesText();
    CHECK(props.contains(QStringLiteral("[1, 64, 56, 56]")));   // its input
    CHECK(props.contains(QStringLiteral("[1, 128, 28, 28]")));  // its output
    CHECK(props.contains(QStringLiteral("73,728")));            // 128 x 64 x 3 x 3 parameters
    CHECK(props.contains(QStringLiteral("strides")));
    // Next and previous walk the matches by op.
    CHECK(view.findNext(QStringLiteral("Gemm")));
    CHECK(view.graph()->nodes[static_cast<size_t>(view.selectedNode())].name == "fc");
    CHECK(!view.findNext(QStringLiteral("no such op")));
    REQUIRE(view.grab().save(outputPath("graph_view_resnet18_selected.png")));

    // Collapse to module boxes, then open one: fewer boxes, then more.
    view.collapseAll();
    REQUIRE(waitForLayout(view, ready));
    const int collapsedBoxes = view.visibleBoxes();
    CHECK(collapsedBoxes < 20);
    CHECK(view.collapsedScopes().count("layer1") == 1);
    view.expandScope(QStringLiteral("layer1"));
    REQUIRE(waitForLayout(view, ready));
    CHECK(view.visibleBoxes() > collapsedBoxes);
    CHECK(view.collapsedScopes().count("layer1") == 0);
    CHECK(view.collapsedScopes().count("layer1.0") == 1);
    // Searching for a node inside a collapsed scope opens it and selects the node.
    view.findNext(QStringLiteral("layer3.1.bn2"));
    REQUIRE(waitUntil(
        [&] {
            return view.selectedNode() >= 0 &&
                   view.graph()->nodes[static_cast<size_t>(view.selectedNode())].name == "layer3.1.bn2";
        },
        60000));
    view.expandAll();
    REQUIRE(waitForLayout(view, ready));
    CHECK(view.visibleBoxes() == 71);

    // Horizontal: wider than tall.
    view.setHorizontal(true);
    REQUIRE(waitForLayout(view, ready));
    const QImage wide = view.renderImage(1.0);
    CHECK(wide.width() > 3 * wide.height());
    view.setHorizontal(false);
    REQUIRE(waitForLayout(view, ready));
    const QImage tall = view.renderImage(1.0);
    CHECK(tall.height() > 3 * tall.width());

    // Export: PNG as drawn, SVG by Graphviz with the same boxes.
    QString error;
    const QString png = outputPath("graph_view_resnet18_export.png"),
                  svg = outputPath("graph_view_resnet18.svg");
    REQUIRE(view.exportTo(png, &error));
    REQUIRE(view.exportTo(svg, &error));
    QFile s(svg);
    REQUIRE(s.open(QIODevice::ReadOnly));
    const QByteArray svgText = s.readAll();
    CHECK(svgText.contains("<svg"));
    CHECK(svgText.contains("layer2.0.conv1"));
    CHECK(QImage(png).width() > 0);
    CHECK(!view.exportTo(dir.filePath(QStringLiteral("graph.bmp")), &error));
    CHECK(error.contains(QStringLiteral(".png or .svg")));
}

TEST_CASE("Graph view: a bad file shows the reader's message", "[widgets][graph]") {
    QTemporaryDir dir;
    const QString bad = dir.filePath(QStringLiteral("bad.onnx"));
    QFile f(bad);
    REQUIRE(f.open(QIODevice::WriteOnly));
    f.write("not a model");
    f.close();
    GraphView view;
    view.show();
    QSignalSpy failed(&view, &GraphView::loadFailed);
    view.openFile(bad);
    REQUIRE(waitUntil([&] { return !failed.isEmpty(); }, 30000));
    CHECK(failed.at(0).at(0).toString().contains(QStringLiteral("is not an ONNX model")));
    CHECK(!view.hasLayout());
}

TEST_CASE("Graph view: a TorchScript file that crashes LibTorch's loader is an error, not a crash",
          "[widgets][graph]") {
    // Found by tests/fuzz/fuzz_torchscript_graph.cpp: LibTorch 1.13 segfaults loading it (in a
    // fresh process on these machines). The view reads TorchScript through a lathectl child.
    const QString file =
        QStringLiteral(LATHE_SOURCE_DIR "/tests/fuzz/torchscript_crashes/segv-class-constant-1.pt");
    REQUIRE(QFile::exists(file));
    GraphView view;
    view.show();
    QSignalSpy failed(&view, &GraphView::loadFailed);
    view.openFile(file);
    REQUIRE(waitUntil([&] { return !failed.isEmpty(); }, 60000));
    const QString message = failed.at(0).at(0).toString();
    INFO(message.toStdString());
    CHECK(message.contains(QStringLiteral("segv-class-constant-1.pt")));
    CHECK(!view.hasLayout());
}

TEST_CASE("Graph view: a 5,000-op graph opens collapsed, a heat map colours by time", "[widgets][graph]") {
    // A stack of 250 blocks of 20 ops under "blocks.i": too many to open expanded.
    core::ModelGraph g;
    g.name = "synthetic";
    auto add = [&](const std::string& op, const std::string& cat, const std::string& scope, int64_t from) {
        core::GraphNode n;
        n.id = static_cast<int64_t>(g.nodes.size());
        n.op = op;
        n.category = cat;
        n.scope = scope;
        n.name = scope.empty() ? op : scope + "/" + op + std::to_string(n.id);
        if (from >= 0) g.edges.push_back({from, n.id, {}});
        g.nodes.push_back(n);
        return n.id;
    };
    int64_t x = add("input", "input", "", -1);
    for (int b = 0; b < 250; ++b)
        for (int k = 0; k < 20; ++k)
            x = add(k % 2 ? "aten::relu" : "aten::linear", k % 2 ? "activation" : "linear",
                    "blocks." + std::to_string(b), x);
    add("output", "output", "", x);
    std::vector<double> times(g.nodes.size(), -1);
    for (size_t i = 1; i + 1 < times.size(); ++i) times[i] = g.nodes[i].op == "aten::linear" ? 50000 : 500;

    GraphView view;
    view.resize(1200, 800);
    view.show();
    QSignalSpy ready(&view, &GraphView::layoutReady);
    view.setGraph(g, times);
    REQUIRE(waitForLayout(view, ready));
    CHECK(view.visibleBoxes() == 252);  // input, 250 block boxes, output
    CHECK(view.collapsedScopes().size() == 250);
    auto* heat = view.findChild<QToolButton*>(QStringLiteral("graphHeatMap"));
    REQUIRE(heat != nullptr);
    CHECK(heat->isEnabled());
    view.expandScope(QStringLiteral("blocks.0"));
    REQUIRE(waitForLayout(view, ready));
    CHECK(view.visibleBoxes() == 271);
    const QImage plain = view.renderImage(1.0);
    view.setHeatMap(true);
    CHECK(view.heatMap());
    const QImage hot = view.renderImage(1.0);
    CHECK(plain != hot);
    REQUIRE(view.grab().save(outputPath("graph_view_heat_map.png")));
    // The properties of a linear op in the opened block carry its time.
    view.selectNode(1);
    CHECK(view.propertiesText().contains(QStringLiteral("50.0 µs")));
}
