// bench_overlay: selecting many runs in the Curves tab. Builds a workspace of N runs × P points
// (train loss and accuracy every step, validation every 20th; lr, batch and optimizer params),
// then, in one process, with a 10 ms timer measuring the event loop's longest stall:
//   overlay   Dashboard::showRuns of all N runs: read and rendered off the GUI thread
//   baseline  the one-graph-per-series path (store reads and setSeries on the GUI thread, as the
//             dashboard draws up to a dozen runs) for the first K runs
// and then a zoom, a pan and a colour change of the overlay. The overlay is measured from rows
// (the workspace's packed series dropped first) and then from packs (Store::packSeries, timed). Fails when
// the overlay never arrives or holds the wrong number of curves or points; never because a figure is slow.
//
//   QT_QPA_PLATFORM=offscreen bench_overlay [--runs N] [--points P] [--baseline-runs K]
//                                           [--workspace FILE] [--screenshot PNG] [--quick] [--out DIR]
#include <sqlite3.h>
#include <unistd.h>
#include <QApplication>
#include <QElapsedTimer>
#include <QEventLoop>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QTimer>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_args.h"
#include "lathe/core/store.h"
#include "lathe/widgets/dashboard.h"
#include "lathe/widgets/metric_chart.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/run_list_model.h"
#include "lathe/widgets/run_overlay.h"
#include "main_window.h"

namespace fs = std::filesystem;
using lathe::core::Store;
using lathe::widgets::Dashboard;

namespace {

double msSince(const QElapsedTimer& t) { return double(t.nsecsElapsed()) / 1e6; }

// Drops the workspace's packed series, so that an overlay reads rows (as in a workspace recorded
// before packs existed).
void dropPacks(const std::string& path) {
    sqlite3* db = nullptr;
    if (sqlite3_open(path.c_str(), &db) != SQLITE_OK ||
        sqlite3_exec(db, "DELETE FROM metric_packs", nullptr, nullptr, nullptr) != SQLITE_OK) {
        std::fprintf(stderr, "bench_overlay: cannot drop the packs of %s: %s\n", path.c_str(),
                     sqlite3_errmsg(db));
        std::exit(1);
    }
    sqlite3_close(db);
}

// Counts points per run: train keys every step, val keys every 20th step, P points in all.
int64_t stepsFor(int64_t points) { return std::max<int64_t>(1, points * 10 / 21); }

void buildWorkspace(const std::string& path, int runs, int64_t points) {
    Store store(path);
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::normal_distribution<double> noise(0.0, 1.0);
    const int64_t steps = stepsFor(points);
    const char* optimizers[] = {"adam", "sgd"};
    const char* batches[] = {"32", "64", "128"};
    for (int r = 0; r < runs; ++r) {
        const double lr = std::pow(10.0, -4.0 + 3.0 * u(rng));
        const std::map<std::string, std::string> params{
            {"lr", std::to_string(lr)}, {"batch", batches[r % 3]}, {"optimizer", optimizers[r % 2]}};
        const int64_t run =
            store.createRun("overlay", "run-" + std::to_string(r), "mlp", "synthetic", "", params, "bench");
        // Faster learning rates fall faster and plateau higher: the overlay shows the spread.
        const double tau = double(steps) * (0.02 + 0.3 * (1.0 - std::log10(lr / 1e-4) / 3.0));
        const double floor = 0.05 + 0.4 * u(rng);
        for (int64_t s = 0; s < steps; ++s) {
            const double decay = std::exp(-double(s) / tau);
            const double loss = floor + 2.2 * decay + 0.05 * noise(rng);
            store.appendMetric(run, "train/loss", s, 1.7e9 + double(s), loss);
            store.appendMetric(run, "train/accuracy", s, 1.7e9 + double(s),
                               std::clamp(0.97 - floor - 0.8 * decay + 0.02 * noise(rng), 0.0, 1.0));
            if (s % 20 == 19) {
                store.appendMetric(run, "val/loss", s, 1.7e9 + double(s), loss + 0.05);
                store.appendMetric(run, "val/accuracy", s, 1.7e9 + double(s),
                                   std::clamp(0.95 - floor - 0.8 * decay, 0.0, 1.0));
            }
        }
        store.setRunStatus(run, lathe::core::RunStatus::Completed);
    }
    store.flush();
}

// The event loop's longest gap between ticks of a 10 ms timer, minus the 10 ms.
class StallMeter {
public:
    StallMeter() {
        m_timer.setInterval(10);
        m_timer.setTimerType(Qt::PreciseTimer);
        QObject::connect(&m_timer, &QTimer::timeout, [this] {
            const double now = msSince(m_clock);
            m_worst = std::max(m_worst, now - m_last - 10.0);
            m_last = now;
        });
    }
    void start() {
        m_worst = 0;
        m_clock.start();
        m_last = 0;
        m_timer.start();
    }
    double stop() {
        m_timer.stop();
        return std::max(0.0, m_worst);
    }

private:
    QTimer m_timer;
    QElapsedTimer m_clock;
    double m_last = 0, m_worst = 0;
};

// Runs the event loop until `done` holds (checked every 2 ms) or `timeoutMs` passes.
bool waitFor(const std::function<bool()>& done, double timeoutMs) {
    QElapsedTimer t;
    t.start();
    QEventLoop loop;
    QTimer poll;
    QObject::connect(&poll, &QTimer::timeout, [&] {
        if (done() || msSince(t) > timeoutMs) loop.quit();
    });
    poll.start(2);
    loop.exec();
    return done();
}

// Runs `action` inside the event loop, so the stall meter sees its time.
void post(const std::function<void()>& action) { QTimer::singleShot(0, action); }

}  // namespace

int main(int argc, char** argv) {
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    QApplication app(argc, argv);
    const auto args = lathe::test::benchArgs(argc, argv);
    int runs = args.quick ? 200 : 1000;
    int64_t points = args.quick ? 2000 : 10000;
    int baselineRuns = args.quick ? 12 : 100;
    std::string workspace, screenshot;
    for (int i = 1; i + 1 < argc; ++i) {
        if (!std::strcmp(argv[i], "--runs"))
            runs = std::max(13, std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--points"))
            points = std::max<int64_t>(21, std::atoll(argv[++i]));
        else if (!std::strcmp(argv[i], "--baseline-runs"))
            baselineRuns = std::max(1, std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--workspace"))
            workspace = argv[++i];
        else if (!std::strcmp(argv[i], "--screenshot"))
            screenshot = argv[++i];
    }
    baselineRuns = std::min(baselineRuns, runs);
    const int64_t steps = stepsFor(points);
    const int64_t perRun = 2 * steps + 2 * (steps / 20);

    fs::path tmp;
    if (workspace.empty()) {
        tmp = fs::temp_directory_path() / ("lathe-bench-overlay-" + std::to_string(::getpid()));
        fs::create_directories(tmp);
        workspace = (tmp / "overlay.db").string();
    }
    QElapsedTimer t;
    if (!fs::exists(workspace)) {
        t.start();
        buildWorkspace(workspace, runs, points);
        std::printf("bench_overlay: built %s: %d runs x %lld points in %.1f s (%.0f MB)\n", workspace.c_str(),
                    runs, static_cast<long long>(perRun), msSince(t) / 1000.0,
                    double(fs::file_size(workspace)) / 1e6);
    }
    int rc = 0;
    {
        Store store(workspace);
        std::vector<int64_t> ids;
        for (const auto& r : store.listRuns()) ids.push_back(r.id);
        std::sort(ids.begin(), ids.end());
        if (int(ids.size()) < runs) {
            std::fprintf(stderr, "bench_overlay: %s has %zu runs, fewer than --runs %d\n", workspace.c_str(),
                         ids.size(), runs);
            return 1;
        }
        ids.resize(size_t(runs));

        Dashboard dash;
        dash.resize(1200, 900);
        dash.show();
        QApplication::processEvents();
        StallMeter meter;

        // ---- overlay: all runs -------------------------------------------------------------
        // Twice: first from rows (the workspace's packs dropped, as in a workspace recorded before
        // packs), then from the packs that ended runs keep (Store::packSeries, timed between).
        auto overlayDone = [&](const QElapsedTimer& shown) {
            return shown.isValid() && !dash.overlayLoading() && dash.lossChart()->hasOverlay() &&
                   dash.lossChart()->overlayCurrent() && dash.accuracyChart()->overlayCurrent();
        };
        struct OverlayFigures {
            double loadedMs = 0, drawnMs = 0, stallMs = 0;
        };
        auto measureOverlay = [&](const char* what) {
            OverlayFigures f;
            dash.clear();
            QApplication::processEvents();
            QElapsedTimer shown;
            meter.start();
            post([&] {
                shown.start();
                dash.showRuns(store, ids);
            });
            const auto c =
                QObject::connect(&dash, &Dashboard::overlayLoaded, [&] { f.loadedMs = msSince(shown); });
            const bool arrived = waitFor([&] { return overlayDone(shown); }, 600000);
            QObject::disconnect(c);
            f.drawnMs = msSince(shown);
            f.stallMs = meter.stop();
            const auto* loss = dash.lossChart()->overlayData();
            const auto* acc = dash.accuracyChart()->overlayData();
            const int64_t gotPoints = (loss ? loss->points : 0) + (acc ? acc->points : 0);
            const size_t gotCurves = (loss ? loss->curves.size() : 0) + (acc ? acc->curves.size() : 0);
            if (!arrived || gotCurves != size_t(runs) * 4 || gotPoints != int64_t(runs) * perRun) {
                std::fprintf(
                    stderr,
                    "bench_overlay: FAILED: overlay %s %s with %zu curves and %lld points (expected %d "
                    "curves, %lld points)\n",
                    what, arrived ? "arrived" : "never arrived", gotCurves, static_cast<long long>(gotPoints),
                    runs * 4, static_cast<long long>(int64_t(runs) * perRun));
                rc = 1;
            }
            return f;
        };
        dropPacks(workspace);
        const OverlayFigures fromRows = measureOverlay("from rows");
        QElapsedTimer packing;
        packing.start();
        store.packSeries(ids);
        store.flush();
        const double packMs = msSince(packing);
        const OverlayFigures fromPacks = measureOverlay("from packs");
        const double loadedMs = fromPacks.loadedMs, overlayMs = fromPacks.drawnMs,
                     overlayStall = fromPacks.stallMs;

        // ---- zoom, pan and recolour the overlay: renders off the GUI thread -----------------
        auto rendered = [&] {
            return dash.lossChart()->overlayCurrent() && dash.accuracyChart()->overlayCurrent();
        };
        QCustomPlot* plot = dash.lossChart()->plot();
        const QCPRange full = plot->xAxis->range();
        QElapsedTimer op;
        meter.start();
        post([&] {
            op.start();
            plot->xAxis->setRange(full.lower, full.lower + full.size() / 4);
            plot->replot(QCustomPlot::rpQueuedReplot);
        });
        waitFor([&] { return op.isValid() && rendered(); }, 60000);
        const double zoomMs = msSince(op);
        post([&] {
            op.start();
            plot->xAxis->moveRange(full.size() / 8);
            plot->replot(QCustomPlot::rpQueuedReplot);
        });
        waitFor([&] { return rendered(); }, 60000);
        const double panMs = msSince(op);
        post([&] {
            op.start();
            dash.setOverlayColorKey(QStringLiteral("lr"));
        });
        waitFor([&] { return rendered(); }, 60000);
        const double recolourMs = msSince(op);
        const double interactStall = meter.stop();
        if (!screenshot.empty()) {
            plot->xAxis->setRange(full);
            plot->replot();
            waitFor([&] { return rendered(); }, 60000);
            for (auto* c : {dash.lossChart(), dash.accuracyChart()})
                c->plot()->replot(QCustomPlot::rpImmediateRefresh);  // the new image's replot is queued
            dash.grab().save(QString::fromStdString(screenshot));
        }

        // ---- the workbench: the window on this workspace, every run selected (Ctrl+A) ---------
        double windowMs = 0, windowStall = 0;
        {
            lathe::app::MainWindow window(std::make_unique<Store>(workspace));
            window.resize(1400, 900);
            window.show();
            waitFor([&] { return !window.isRefreshingRuns() && window.runModel()->rowCount() >= runs; },
                    60000);
            QApplication::processEvents();
            auto* d = window.dashboard();
            QElapsedTimer w;
            meter.start();
            post([&] {
                w.start();
                window.runTable()->selectAll();
            });
            const bool ok = waitFor(
                [&] {
                    return w.isValid() && !d->overlayLoading() && d->lossChart()->hasOverlay() &&
                           d->lossChart()->overlayCurrent() && d->accuracyChart()->overlayCurrent();
                },
                600000);
            windowMs = msSince(w);
            windowStall = meter.stop();
            if (!screenshot.empty()) {
                for (auto* c : {d->lossChart(), d->accuracyChart()})
                    c->plot()->replot(QCustomPlot::rpImmediateRefresh);
                const fs::path shot(screenshot);
                window.grab().save(QString::fromStdString(
                    (shot.parent_path() / ("window-" + shot.filename().string())).string()));
            }
            if (!ok || int(d->shownRuns().size()) != int(window.runModel()->rowCount())) {
                std::fprintf(stderr, "bench_overlay: FAILED: selecting all %d runs in the window %s\n",
                             window.runModel()->rowCount(),
                             ok ? "showed another number of runs" : "never drew");
                rc = 1;
            }
        }

        // ---- baseline: one graph per series on the GUI thread ---------------------------------
        dash.clear();
        QApplication::processEvents();
        lathe::widgets::MetricChart* charts[] = {dash.lossChart(), dash.accuracyChart()};
        QElapsedTimer base;
        meter.start();
        post([&] {
            base.start();
            for (int i = 0; i < baselineRuns; ++i)
                for (const auto& key : store.metricKeys(ids[size_t(i)])) {
                    auto* chart = dash.chartFor(key);
                    if (chart) chart->setSeries(ids[size_t(i)], key, store.metrics(ids[size_t(i)], key));
                }
            for (auto* c : charts) c->plot()->replot(QCustomPlot::rpImmediateRefresh);
        });
        waitFor([&] { return base.isValid() && msSince(base) > 20; }, 600000);
        const double baselineStall = meter.stop();
        const double baselineMs = baselineStall;

        std::printf("bench_overlay: %d runs x %lld points (%lld points), 1200x900 dashboard, %s\n", runs,
                    static_cast<long long>(perRun), static_cast<long long>(int64_t(runs) * perRun),
                    qPrintable(QApplication::platformName()));
        std::printf(
            "  overlay of %d runs from rows:  loaded in %8.1f ms, drawn in %8.1f ms; longest GUI stall %6.1f "
            "ms\n",
            runs, fromRows.loadedMs, fromRows.drawnMs, fromRows.stallMs);
        std::printf("  packing their series (once, Store::packSeries): %.1f ms\n", packMs);
        std::printf(
            "  overlay of %d runs from packs: loaded in %8.1f ms, drawn in %8.1f ms; longest GUI stall %6.1f "
            "ms\n",
            runs, loadedMs, overlayMs, overlayStall);
        std::printf("  rows / packs, time to drawn: %.2fx\n",
                    overlayMs > 0 ? fromRows.drawnMs / overlayMs : 0.0);
        std::printf(
            "  zoom %.1f ms, pan %.1f ms, colour by lr %.1f ms to a new image; longest GUI stall %6.1f ms\n",
            zoomMs, panMs, recolourMs, interactStall);
        std::printf(
            "  the window, Ctrl+A on the runs list: all runs drawn in %8.1f ms; longest GUI stall %6.1f ms\n",
            windowMs, windowStall);
        std::printf("  baseline, %d runs as graphs on the GUI thread: %8.1f ms (all of it a stall)\n",
                    baselineRuns, baselineMs);
        std::printf("  stall ratio, baseline (%d runs) / overlay (%d runs): %.1fx\n", baselineRuns, runs,
                    overlayStall > 0 ? baselineStall / overlayStall : 0.0);
        if (!args.out.empty()) {
            fs::create_directories(args.out);
            std::ofstream(fs::path(args.out) / "bench_overlay.json")
                << "{\"runs\": " << runs << ", \"points_per_run\": " << perRun
                << ", \"rows_overlay_drawn_ms\": " << fromRows.drawnMs << ", \"pack_ms\": " << packMs
                << ", \"overlay_loaded_ms\": " << loadedMs << ", \"overlay_drawn_ms\": " << overlayMs
                << ", \"overlay_longest_stall_ms\": " << overlayStall << ", \"zoom_ms\": " << zoomMs
                << ", \"pan_ms\": " << panMs << ", \"recolour_ms\": " << recolourMs
                << ", \"interaction_longest_stall_ms\": " << interactStall
                << ", \"window_select_all_ms\": " << windowMs
                << ", \"window_longest_stall_ms\": " << windowStall << ", \"baseline_runs\": " << baselineRuns
                << ", \"baseline_stall_ms\": " << baselineStall << "}\n";
        }
    }
    // ---- the runs list at 10,000 runs: fill, refresh, sort, filter (on the GUI thread) -------
    {
        const int n = args.quick ? 2000 : 10000;
        lathe::widgets::RunListModel model;
        lathe::widgets::RunFilterProxy proxy;  // as the window has it
        proxy.setSourceModel(&model);
        proxy.setSortRole(lathe::widgets::RunListModel::SortRole);
        QTableView view;
        view.setModel(&proxy);
        view.setSortingEnabled(true);
        view.sortByColumn(0, Qt::DescendingOrder);
        view.resize(900, 600);
        view.show();
        QApplication::processEvents();
        std::vector<lathe::core::RunRecord> records;
        std::map<int64_t, double> accuracy;
        for (int i = n; i >= 1; --i) {
            lathe::core::RunRecord r;
            r.id = i;
            r.name = "run-" + std::to_string(int64_t(i) * 7919 % n);
            r.experiment = "sweep-" + std::to_string(i % 13);
            r.status = i % 17 ? lathe::core::RunStatus::Completed : lathe::core::RunStatus::Failed;
            r.model = i % 2 ? "mlp" : "cnn";
            r.data = "digits";
            r.createdAt = 1.7e9 + i;
            records.push_back(r);
            accuracy[i] = double(i * 31 % 1000) / 1000.0;
        }
        auto timed = [&](const std::function<void()>& f) {
            QElapsedTimer e;
            e.start();
            f();
            QApplication::processEvents();
            return msSince(e);
        };
        const double fill = timed([&] { model.setRuns(records, accuracy); });
        records[5].status = lathe::core::RunStatus::Running;
        const double refresh = timed([&] { model.setRuns(records, accuracy); });
        auto grown = records;
        for (int i = n + 1; i <= n + 10; ++i) {
            lathe::core::RunRecord r;
            r.id = i;
            r.name = "new-" + std::to_string(i);
            grown.insert(grown.begin(), r);
        }
        const double added = timed([&] { model.setRuns(grown, accuracy); });
        const double byName =
            timed([&] { view.sortByColumn(lathe::widgets::RunListModel::ColName, Qt::AscendingOrder); });
        const double byAccuracy = timed(
            [&] { view.sortByColumn(lathe::widgets::RunListModel::ColValAccuracy, Qt::DescendingOrder); });
        const double filter = timed([&] { proxy.setFilterText(QStringLiteral("SWEEP-12")); });
        const int shown = proxy.rowCount();
        const double refilter = timed([&] { proxy.setFilterText(QStringLiteral("sweep-1")); });
        const double unfilter = timed([&] { proxy.setFilterText(QString()); });
        // Baseline: Qt's own filter over every column (what the window used before), same rows.
        QSortFilterProxyModel generic;
        generic.setSourceModel(&model);
        generic.setSortRole(lathe::widgets::RunListModel::SortRole);
        generic.setFilterKeyColumn(-1);
        generic.setFilterCaseSensitivity(Qt::CaseInsensitive);
        QTableView genericView;
        genericView.setModel(&generic);
        genericView.setSortingEnabled(true);
        genericView.sortByColumn(lathe::widgets::RunListModel::ColValAccuracy, Qt::DescendingOrder);
        genericView.resize(900, 600);
        genericView.show();
        QApplication::processEvents();
        const double genericFilter = timed([&] { generic.setFilterFixedString(QStringLiteral("SWEEP-12")); });
        const int genericShown = generic.rowCount();
        if (model.rowCount() != n + 10 || shown <= 0 || shown >= n || genericShown != shown) {
            std::fprintf(
                stderr,
                "bench_overlay: FAILED: runs list holds %d rows (want %d), filter kept %d (Qt's: %d)\n",
                model.rowCount(), n + 10, shown, genericShown);
            rc = 1;
        }
        std::printf(
            "  runs list of %d runs (GUI thread): fill %.1f ms, refresh %.1f ms, 10 new runs %.1f ms, "
            "sort by name %.1f ms, by accuracy %.1f ms, filter %.1f ms (%d rows; first, texts made), again "
            "%.1f ms, clear filter %.1f ms\n",
            n, fill, refresh, added, byName, byAccuracy, filter, shown, refilter, unfilter);
        std::printf(
            "  filter baseline, QSortFilterProxyModel over every column: %.1f ms (%.1fx the first filter)\n",
            genericFilter, filter > 0 ? genericFilter / filter : 0.0);
    }
    if (!tmp.empty()) fs::remove_all(tmp);
    return rc;
}
