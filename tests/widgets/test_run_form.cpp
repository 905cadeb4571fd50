#include <catch2/catch.hpp>

#include <QLineEdit>
#include <QPushButton>
#include <QSignalSpy>
#include <QTest>

#include "lathe/widgets/run_form.h"
#include "test_helpers.h"

using lathe::widgets::RunForm;

TEST_CASE("RunForm validates as you type and gates Start", "[widgets][form]") {
    RunForm form;
    form.resize(360, 520);
    form.show();

    for (const char* key : {"model", "data", "optimizer", "lr", "batch", "epochs", "seed", "hidden"})
        CHECK(form.hasField(QString::fromLatin1(key)));
    REQUIRE(form.isValid());
    REQUIRE(form.startButton()->isEnabled());
    CHECK_FALSE(form.stopButton()->isEnabled());

    // A bad learning rate typed key by key.
    auto* lr = qobject_cast<QLineEdit*>(form.fieldWidget("lr"));
    REQUIRE(lr != nullptr);
    lr->selectAll();
    QTest::keyClicks(lr, "-0.5");
    CHECK(form.fieldText("lr") == "-0.5");
    CHECK_FALSE(form.isValid());
    CHECK_FALSE(form.startButton()->isEnabled());
    CHECK(form.fieldError("lr").contains("lr"));
    CHECK(form.errorText().contains("lr"));
    CHECK(lr->toolTip() == form.fieldError("lr"));
    CHECK(lr->styleSheet().contains("border"));
    form.grab().save(lathe::test::outputPath("run_form_invalid.png"));

    form.setFieldText("lr", "abc");
    CHECK_FALSE(form.startButton()->isEnabled());

    // Fixed: valid again, the message and the red border go away.
    lr->selectAll();
    QTest::keyClicks(lr, "0.01");
    CHECK(form.isValid());
    CHECK(form.startButton()->isEnabled());
    CHECK(form.fieldError("lr").isEmpty());
    CHECK(form.errorText().isEmpty());
    CHECK(lr->styleSheet().isEmpty());

    // Other fields are checked by core too.
    form.setFieldText("epochs", "0");
    CHECK_FALSE(form.startButton()->isEnabled());
    CHECK(form.fieldError("epochs").contains("epochs"));
    form.setFieldText("epochs", "3");
    form.setFieldText("data", "nonsense:xyz");
    CHECK_FALSE(form.isValid());
    form.setFieldText("data", "synthetic:spirals");
    form.setFieldText("hidden", "64,32");
    REQUIRE(form.isValid());

    QSignalSpy start(&form, &RunForm::startRequested);
    QTest::mouseClick(form.startButton(), Qt::LeftButton);
    REQUIRE(start.count() == 1);
    const auto spec = form.spec();
    CHECK(spec.lr == Approx(0.01));
    CHECK(spec.epochs == 3);
    CHECK(spec.data == "synthetic:spirals");
    CHECK(spec.hidden == std::vector<int64_t>{64, 32});

    form.setRunning(true);
    CHECK_FALSE(form.startButton()->isEnabled());
    CHECK(form.stopButton()->isEnabled());
    QSignalSpy stop(&form, &RunForm::stopRequested);
    QTest::mouseClick(form.stopButton(), Qt::LeftButton);
    CHECK(stop.count() == 1);
    form.setRunning(false);
    CHECK(form.startButton()->isEnabled());

    // setSpec round-trips.
    lathe::core::RunSpec other;
    other.lr = 0.25;
    other.optimizer = "sgd";
    form.setSpec(other);
    CHECK(form.fieldText("optimizer") == "sgd");
    CHECK(form.spec().lr == Approx(0.25));
}
