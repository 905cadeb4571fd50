// The A/B rollout dashboard on the Models page (widgets/rollout_view.h) over a workspace with a
// rollout of digits v3 beside v2 that has stepped once, held and seen an unhealthy window:
// what it shows, what its buttons ask, and that Pause and Abort act on the workspace.
#include <QPushButton>
#include <QTableWidget>

#include <catch2/catch.hpp>

#include "lathe/core/rollout.h"
#include "lathe/widgets/models_view.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/rollout_view.h"
#include "registry_fixture.h"
#include "test_helpers.h"

using namespace lathe;

namespace {

// A rollout of v3 beside the live v2, with 30 s of both variants' figures.
int64_t addRollout(test::RegistryFixture& fx) {
    auto& reg = *fx.registry;
    // v2 live where no server answers (port 9, discard): the actions must not reach any other.
    core::Deployment live;
    live.model = "digits";
    live.version = 2;
    live.url = "http://127.0.0.1:9";
    reg.recordDeployment(live);
    core::Rollout r;
    r.model = "digits";
    r.baseline = 2;
    r.candidate = 3;
    r.stepsBp = {500, 2500, 5000, 10000};
    r.intervalS = 600;
    r.weightBp = 500;
    r.id = reg.createRollout(r);
    const double t = fx.now();
    auto decide = [&](const char* kind, int step, int32_t bp, const char* reason, double at,
                      const char* actor = "auto") {
        core::RolloutDecision d;
        d.rolloutId = r.id;
        d.kind = kind;
        d.step = step;
        d.weightBp = bp;
        d.reason = reason;
        d.t = at;
        d.actor = actor;
        d.numbers = R"({"candidate_requests":412,"baseline_requests":7801})";
        reg.addRolloutDecision(d);
    };
    decide("start", 0, 500, "v3 beside v2 at 5%", t, "user");
    decide("healthy", 0, 500, "error rate 0.00% vs 0.00%", t + 10);
    decide("advance", 1, 2500, "to step 2 of 4 (25%) after a healthy window", t + 10);
    decide("hold", 1, 2500, "the candidate has answered 150 of the 200 requests needed", t + 15);
    decide("hold", 1, 2500, "the candidate has answered 190 of the 200 requests needed", t + 18);
    decide("unhealthy", 1, 2500, "error rate 4.10% vs 0.10% (p<0.0001), limit 1.00% (1 of 3)", t + 25);
    r.step = 1;
    r.weightBp = 2500;
    r.badInRow = 1;
    reg.updateRollout(r);
    for (int i = 0; i < 30; ++i) {
        for (int64_t v : {2, 3}) {
            const double slow = v == 3 ? 1.6 : 1.0;
            reg.appendServingMetrics("digits", v, t + i,
                                     {{"variant/p50_ms", 4.0 * slow},
                                      {"variant/p90_ms", 7.0 * slow},
                                      {"variant/p99_ms", 12.0 * slow + (i % 3)},
                                      {"variant/qps", v == 3 ? (i < 10 ? 2.0 : 10.0) : 38.0},
                                      {"variant/error_rate", v == 3 && i >= 18 ? 0.041 : 0.001}});
        }
    }
    return r.id;
}

}  // namespace

TEST_CASE("the rollout dashboard shows both variants, the weight, the decisions and the verdict",
          "[widgets][rollout]") {
    test::RegistryFixture fx;
    const int64_t id = addRollout(fx);
    widgets::RolloutView view;
    view.resize(1100, 760);
    view.show();
    QStringList asked;
    bool answer = false;
    view.setConfirmHook([&](const QString&, const QString& q) {
        asked << q;
        return answer;
    });
    view.showModel(fx.registry, QStringLiteral("digits"));
    REQUIRE(test::waitUntil([&] { return view.pollCount() >= 1; }, 5000));
    REQUIRE(view.rollout());
    CHECK(view.rollout()->id == id);
    CHECK(view.headerText().contains(QStringLiteral("Rollout %1 of digits").arg(id)));
    CHECK(view.headerText().contains(QStringLiteral("v3 beside v2")));
    CHECK(view.headerText().contains(QStringLiteral("step 2 of 4 (25%)")));
    CHECK(view.headerText().contains(QStringLiteral("controller not running")));
    // The verdict is the last judged window, with its numbers.
    CHECK(view.verdictText().contains(QStringLiteral("unhealthy")));
    CHECK(view.verdictText().contains(QStringLiteral("4.10% vs 0.10%")));
    // Both variants on one time axis, baseline and candidate apart.
    for (auto s : {widgets::RolloutView::P50, widgets::RolloutView::P99, widgets::RolloutView::Qps,
                   widgets::RolloutView::ErrorRate}) {
        CHECK(view.graph(false, s)->dataCount() == 30);
        CHECK(view.graph(true, s)->dataCount() == 30);
    }
    CHECK(view.graph(true, widgets::RolloutView::P99)->data()->at(0)->value == Approx(19.2));
    CHECK(view.graph(true, widgets::RolloutView::ErrorRate)->data()->at(29)->value ==
          Approx(4.1));  // percent
    // The weight as a step line: 5% from the start, 25% from the advance.
    const auto* w = view.weightGraph();
    REQUIRE(w->dataCount() >= 3);
    CHECK(w->data()->at(0)->value == 5);
    CHECK(w->data()->at(w->dataCount() - 1)->value == 25);
    // Markers for changes and bad windows (start, advance, unhealthy), not for every hold.
    CHECK(view.markerCount() == 3);
    // Every decision in the table, newest first; the two holds are one row.
    auto* table = view.decisionTable();
    REQUIRE(table->rowCount() == 5);
    CHECK(table->item(0, 1)->text() == QStringLiteral("unhealthy"));
    CHECK(table->item(1, 1)->text() == QStringLiteral("hold"));
    CHECK(table->item(1, 0)->text().contains(QStringLiteral("×2")));
    CHECK(table->item(4, 4)->text() == QStringLiteral("user"));

    // Buttons follow the state: running without a controller.
    CHECK_FALSE(view.startButton()->isEnabled());  // one rollout at a time
    CHECK(view.pauseButton()->isEnabled());
    CHECK(view.resumeButton()->isEnabled());
    CHECK(view.abortButton()->isEnabled());
    CHECK(view.pauseQuestion().contains(QStringLiteral("keeps answering 25% of the requests")));
    CHECK(view.abortQuestion().contains(QStringLiteral("from 25% to 0% now and v2 answers every request")));
    core::Rollout plan;
    plan.model = "digits";
    plan.candidate = 3;
    plan.stepsBp = {500, 2500, 10000};
    plan.intervalS = 72 * 3600;
    const QString start = view.startQuestion(plan);
    CHECK(start.contains(QStringLiteral("v3 answers 5% of the requests now")));
    CHECK(start.contains(QStringLiteral("then 25%, 100%")));
    CHECK(start.contains(QStringLiteral("window of 72 h")));
    CHECK(start.contains(QStringLiteral("in 3 windows in a row")));

    const auto shot = test::outputPath(QStringLiteral("rollout_view.png"));
    CHECK(view.grab().save(shot));

    // Declined: nothing changes.
    view.pauseButton()->click();
    REQUIRE(asked.size() == 1);
    CHECK(asked.last() == view.pauseQuestion());
    QTest::qWait(100);
    CHECK(fx.registry->activeRollout("digits")->state == "running");

    // Confirmed: paused in the workspace, and the buttons follow.
    answer = true;
    QString finished, error = QStringLiteral("(none)");
    QObject::connect(&view, &widgets::RolloutView::actionFinished, [&](const QString& a, const QString& e) {
        finished = a;
        error = e;
    });
    view.pauseButton()->click();
    REQUIRE(test::waitUntil([&] { return !finished.isEmpty(); }, 10000));
    CHECK(error.isEmpty());
    CHECK(fx.registry->activeRollout("digits")->state == "paused");
    REQUIRE(test::waitUntil([&] { return view.rollout() && view.rollout()->state == "paused"; }, 5000));
    CHECK_FALSE(view.pauseButton()->isEnabled());
    CHECK(view.resumeButton()->isEnabled());

    // Abort: the rollout ends (its server is not running here: said, not hidden).
    finished.clear();
    view.abortButton()->click();
    REQUIRE(test::waitUntil([&] { return !finished.isEmpty(); }, 15000));
    INFO(error.toStdString());
    CHECK(error.isEmpty());
    CHECK_FALSE(fx.registry->activeRollout("digits"));
    const auto ended = fx.registry->rollout(id);
    CHECK(ended->state == "aborted");
    CHECK(ended->weightBp == 0);
    REQUIRE(test::waitUntil([&] { return view.rollout() && !view.rollout()->active(); }, 5000));
    CHECK(view.headerText().contains(QStringLiteral("aborted")));
    CHECK_FALSE(view.abortButton()->isEnabled());
    CHECK(view.startButton()->isEnabled());  // v2 live, v1 and v3 to choose from
}

TEST_CASE("the Models page has the rollout dashboard beside the serving one", "[widgets][rollout]") {
    test::RegistryFixture fx;
    addRollout(fx);
    widgets::ModelsView page;
    page.resize(1100, 900);
    page.show();
    page.setRegistry(fx.registry);
    REQUIRE(test::waitUntil([&] { return page.refreshCount() >= 1; }, 5000));
    page.selectModel(QStringLiteral("digits"));
    auto* view = page.rolloutView();
    REQUIRE(view);
    REQUIRE(test::waitUntil([&] { return view->rollout().has_value(); }, 5000));
    CHECK(view->model() == QStringLiteral("digits"));
    const int polls = view->pollCount();
    page.selectModel(QStringLiteral("spirals"));
    REQUIRE(test::waitUntil(
        [&] { return view->model() == QStringLiteral("spirals") && view->pollCount() > polls; }, 5000));
    CHECK_FALSE(view->rollout());
    CHECK(view->headerText().contains(QStringLiteral("has had no rollout")));
    CHECK_FALSE(view->startButton()->isEnabled());  // not deployed
}
