#include <catch2/catch.hpp>

#include <QCheckBox>
#include <QComboBox>
#include <QGroupBox>
#include <QLineEdit>
#include <QPushButton>
#include <QRadioButton>
#include <QSignalSpy>
#include <QSpinBox>
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

TEST_CASE("RunForm groups precision and profiling, with checkboxes for bool keys", "[widgets][form]") {
    RunForm form;
    form.resize(380, 900);
    form.show();
    auto* group = form.findChild<QGroupBox*>("precisionGroup");
    REQUIRE(group != nullptr);
    for (const char* key : {"precision", "loss_scale", "activation_checkpointing", "profile", "profile_wait",
                            "profile_warmup", "profile_active", "profile_repeat"}) {
        INFO(key);
        REQUIRE(form.hasField(QString::fromLatin1(key)));
        CHECK(group->isAncestorOf(form.fieldWidget(QString::fromLatin1(key))));
    }
    // Every "bool" key of the spec table is a checkbox, wherever it sits.
    for (const auto& key : lathe::core::specKeys())
        if (key.kind == "bool") {
            INFO(key.name);
            CHECK(qobject_cast<QCheckBox*>(form.fieldWidget(QString::fromStdString(key.name))) != nullptr);
        }
    auto* profile = qobject_cast<QCheckBox*>(form.fieldWidget("profile"));
    auto* checkpointing = qobject_cast<QCheckBox*>(form.fieldWidget("activation_checkpointing"));
    REQUIRE(profile != nullptr);
    REQUIRE(checkpointing != nullptr);
    REQUIRE(form.isValid());

    // The schedule only applies with Profile on.
    CHECK_FALSE(profile->isChecked());
    CHECK_FALSE(form.fieldWidget("profile_wait")->isEnabled());
    CHECK_FALSE(form.isFieldActive("profile_active"));
    QTest::mouseClick(profile, Qt::LeftButton, {}, QPoint(8, profile->height() / 2));
    CHECK(profile->isChecked());
    CHECK(form.fieldText("profile") == "true");
    CHECK(form.fieldWidget("profile_wait")->isEnabled());
    CHECK(form.isFieldActive("profile_active"));

    // Schedule fields are validated as you type like the others.
    auto* active = qobject_cast<QLineEdit*>(form.fieldWidget("profile_active"));
    REQUIRE(active != nullptr);
    active->selectAll();
    QTest::keyClicks(active, "x");
    CHECK_FALSE(form.isValid());
    CHECK(form.fieldError("profile_active").contains("profile_active"));
    CHECK(active->styleSheet().contains("border"));
    form.grab().save(lathe::test::outputPath("run_form_precision_invalid.png"));
    // Switching Profile off makes the bad value irrelevant; on again, it counts again.
    QTest::mouseClick(profile, Qt::LeftButton, {}, QPoint(8, profile->height() / 2));
    CHECK(form.isValid());
    CHECK(form.fieldError("profile_active").isEmpty());
    form.setFieldText("profile", "on");
    CHECK_FALSE(form.isValid());
    form.setFieldText("profile_active", "3");
    form.setFieldText("profile_wait", "1");
    REQUIRE(form.isValid());

    // Loss scale: typed modes are checked by core; the dynamic scaler's knobs follow the mode.
    form.setFieldText("precision", "fp16");
    form.setFieldText("loss_scale", "static:abc");
    CHECK_FALSE(form.isValid());
    CHECK(form.fieldError("loss_scale").contains("loss_scale"));
    form.setFieldText("loss_scale", "static:1024");
    CHECK(form.isValid());
    CHECK_FALSE(form.isFieldActive("loss_scale_init"));
    form.setFieldText("loss_scale", "dynamic");
    CHECK(form.isFieldActive("loss_scale_init"));
    CHECK(form.fieldWidget("loss_scale_growth_interval")->isEnabled());
    form.setFieldText("loss_scale_init", "1024");
    checkpointing->setChecked(true);
    REQUIRE(form.isValid());

    const auto spec = form.spec();
    CHECK(spec.precision == "fp16");
    CHECK(spec.lossScale == "dynamic");
    CHECK(spec.lossScaleInit == Approx(1024));
    CHECK(spec.activationCheckpointing);
    CHECK(spec.profile);
    CHECK(spec.profileActive == 3);
    CHECK(spec.profileWait == 1);
    form.grab().save(lathe::test::outputPath("run_form_precision.png"));

    // Running greys everything; afterwards the dependent fields are greyed by their rule again.
    form.setRunning(true);
    CHECK_FALSE(profile->isEnabled());
    form.setFieldText("profile", "false");
    form.setRunning(false);
    CHECK(profile->isEnabled());
    CHECK_FALSE(form.fieldWidget("profile_wait")->isEnabled());

    // setSpec round-trips the new keys.
    lathe::core::RunSpec other;
    other.precision = "bf16";
    other.profile = true;
    other.profileRepeat = 2;
    form.setSpec(other);
    CHECK(form.fieldText("precision") == "bf16");
    CHECK(profile->isChecked());
    CHECK(form.spec().profileRepeat == 2);
}

TEST_CASE("RunForm offers pipeline stages, micro-batches, schedule and tensor-parallel size",
          "[widgets][form][distributed]") {
    RunForm form;
    form.resize(360, 900);
    form.show();
    auto* group = form.findChild<QGroupBox*>("distributedGroup");
    REQUIRE(group != nullptr);
    for (const char* key :
         {"pipeline_stages", "micro_batches", "pipeline_schedule", "balance", "tensor_parallel"}) {
        INFO(key);
        REQUIRE(form.hasField(QString::fromLatin1(key)));
        CHECK(group->isAncestorOf(form.fieldWidget(QString::fromLatin1(key))));
    }
    // The pipeline's own settings wait for stages.
    CHECK_FALSE(form.isFieldActive("micro_batches"));
    CHECK_FALSE(form.isFieldActive("pipeline_schedule"));
    form.setFieldText("pipeline_stages", "2");
    CHECK(form.isFieldActive("micro_batches"));
    CHECK(form.isFieldActive("balance"));
    form.setFieldText("pipeline_schedule", "gpipe");
    form.setFieldText("micro_batches", "8");
    form.setFieldText("tensor_parallel", "2");
    // Processes must be replicas x stages x shards.
    form.setFieldText("nproc", "6");
    CHECK_FALSE(form.isValid());
    CHECK(form.errorText().contains("multiple of `pipeline_stages x tensor_parallel`"));
    form.setFieldText("nproc", "8");
    REQUIRE(form.isValid());
    const auto spec = form.spec();
    CHECK(spec.pipelineStages == 2);
    CHECK(spec.tensorParallel == 2);
    CHECK(spec.microBatches == 8);
    CHECK(spec.pipelineSchedule == "gpipe");
    CHECK(spec.nproc == 8);
    form.grab().save(lathe::test::outputPath("run_form_model_parallel.png"));
}

TEST_CASE("RunForm Distributed group: processes, buckets and compression", "[widgets][form][distributed]") {
    RunForm form;
    form.resize(360, 900);
    form.show();

    auto* group = form.findChild<QGroupBox*>("distributedGroup");
    REQUIRE(group != nullptr);
    for (const char* key :
         {"nproc", "bucket_mb", "compress", "error_feedback", "compress_chunk", "stochastic_rounding"}) {
        INFO(key);
        REQUIRE(form.hasField(QString::fromLatin1(key)));
        CHECK(group->isAncestorOf(form.fieldWidget(QString::fromLatin1(key))));
    }
    REQUIRE(form.isValid());

    // Processes and bucket size are checked as typed, by core's rules.
    auto* nproc = qobject_cast<QLineEdit*>(form.fieldWidget("nproc"));
    REQUIRE(nproc != nullptr);
    nproc->selectAll();
    QTest::keyClicks(nproc, "0");
    CHECK_FALSE(form.isValid());
    CHECK_FALSE(form.startButton()->isEnabled());
    CHECK(form.fieldError("nproc").contains("nproc"));
    CHECK(form.errorText().contains("nproc"));
    nproc->selectAll();
    QTest::keyClicks(nproc, "2");
    CHECK(form.fieldError("nproc").isEmpty());
    form.setFieldText("bucket_mb", "-1");
    CHECK(form.fieldError("bucket_mb").contains("bucket_mb"));
    form.setFieldText("bucket_mb", "4.5");
    REQUIRE(form.isValid());

    // Quantizer settings apply only to int8/int4.
    for (const char* codec : {"none", "fp16", "bf16"}) {
        form.setFieldText("compress", codec);
        INFO(codec);
        CHECK_FALSE(form.isFieldActive("compress_chunk"));
        CHECK_FALSE(form.fieldWidget("error_feedback")->isEnabled());
        CHECK_FALSE(form.fieldWidget("stochastic_rounding")->isEnabled());
    }
    // A bad chunk behind a greyed field neither blocks Start nor reaches the spec.
    form.setFieldText("compress", "int8");
    form.setFieldText("compress_chunk", "13");
    CHECK_FALSE(form.isValid());
    CHECK(form.errorText().contains("compress_chunk"));
    form.setFieldText("compress", "bf16");
    CHECK(form.isValid());
    CHECK(form.spec().compressChunk == lathe::core::RunSpec{}.compressChunk);

    // Exchange strategies (when core has them) live here too, each with its own parameter.
    if (form.hasField("strategy")) {
        CHECK(group->isAncestorOf(form.fieldWidget("strategy")));
        CHECK_FALSE(form.isFieldActive("ps_ranks"));
        form.setFieldText("strategy", "ps");
        CHECK(form.isFieldActive("ps_ranks"));
        CHECK_FALSE(form.isFieldActive("ranks_per_host"));
        form.setFieldText("strategy", "hierarchical");
        CHECK(form.isFieldActive("ranks_per_host"));
        CHECK_FALSE(form.isFieldActive("ps_ranks"));
        form.setFieldText("strategy", "ring");
        REQUIRE(form.isValid());
    }

    form.setFieldText("compress", "int4");
    CHECK(form.isFieldActive("compress_chunk"));
    CHECK(form.fieldWidget("error_feedback")->isEnabled());
    CHECK(form.fieldWidget("stochastic_rounding")->isEnabled());
    CHECK_FALSE(form.isValid());  // 13 is active again
    form.setFieldText("compress_chunk", "1024");
    form.setFieldText("error_feedback", "off");
    form.setFieldText("stochastic_rounding", "true");
    REQUIRE(form.isValid());

    const auto spec = form.spec();
    CHECK(spec.nproc == 2);
    CHECK(spec.bucketMb == Approx(4.5));
    CHECK(spec.compress == "int4");
    CHECK(spec.errorFeedback == "off");
    CHECK(spec.compressChunk == 1024);
    CHECK(spec.stochasticRounding);
    form.grab().save(lathe::test::outputPath("run_form_distributed.png"));

    lathe::core::RunSpec other;
    other.nproc = 4;
    other.compress = "none";
    form.setSpec(other);
    CHECK(form.fieldText("nproc") == "4");
    CHECK_FALSE(form.isFieldActive("stochastic_rounding"));
}

TEST_CASE("RunForm's Target offers the inventory's hosts and builds the placement",
          "[widgets][form][hosts]") {
    using lathe::core::HostRecord;
    RunForm form;
    form.resize(380, 1000);
    form.show();
    REQUIRE(form.targetGroup() != nullptr);

    // This machine by default: today's behaviour, nproc from the form.
    CHECK_FALSE(form.isTargetHosts());
    CHECK(form.target().isLocal());
    CHECK(form.isFieldActive("nproc"));
    form.setFieldText("nproc", "2");
    REQUIRE(form.isValid());
    CHECK(form.spec().nproc == 2);

    auto host = [](const char* name, const char* address, int slots) {
        HostRecord h;
        h.name = name;
        h.address = address;
        h.slots = slots;
        return h;
    };
    form.setHosts({host("gpu-a", "10.0.0.2", 2), host("gpu-b", "10.0.0.3", 4), host("gpu-c", "10.0.0.4", 1)});
    CHECK(form.targetHostNames() == QStringList({"gpu-a", "gpu-b", "gpu-c"}));
    CHECK(form.target().isLocal());  // offering hosts changes nothing until Hosts is chosen
    REQUIRE(form.hostSlotsBox("gpu-a") != nullptr);
    CHECK(form.hostSlotsBox("gpu-a")->maximum() == 2);
    CHECK(form.hostSlotsBox("gpu-b")->maximum() == 4);
    CHECK(form.hostSlotsBox("gpu-a")->minimum() == 0);  // 0: not used
    CHECK(form.hostSlotsBox("nope") == nullptr);
    CHECK_FALSE(form.setHostSlots("nope", 1));

    // Hosts, nothing chosen yet: not startable, and the processes field is the hosts' business.
    auto* hostsRadio = form.findChild<QRadioButton*>("targetHosts");
    REQUIRE(hostsRadio != nullptr);
    QTest::mouseClick(hostsRadio, Qt::LeftButton, {}, QPoint(8, hostsRadio->height() / 2));
    REQUIRE(form.isTargetHosts());
    CHECK_FALSE(form.isFieldActive("nproc"));
    CHECK_FALSE(form.fieldWidget("nproc")->isEnabled());
    CHECK_FALSE(form.isValid());
    CHECK_FALSE(form.startButton()->isEnabled());
    CHECK(form.errorText().contains("at least 2 slots"));

    REQUIRE(form.setHostSlots("gpu-a", 2));
    REQUIRE(form.setHostSlots("gpu-b", 1));
    CHECK(form.hostSlots("gpu-c") == 0);
    auto target = form.target();
    CHECK(target.placement() == "gpu-a:2,gpu-b:1");
    CHECK(target.totalSlots() == 3);
    REQUIRE(target.hosts.size() == 2);
    CHECK(target.hosts[0].name == "gpu-a");
    CHECK(target.masterAddr.empty());
    CHECK_FALSE(target.stage);
    REQUIRE(form.isValid());
    CHECK(form.spec().nproc == 3);
    CHECK(form.targetSummary() == "3 ranks on gpu-a:2,gpu-b:1");

    // A host's slots cap what can be asked of it.
    form.setHostSlots("gpu-a", 5);
    CHECK(form.hostSlots("gpu-a") == 2);

    // hierarchical groups by host: the same slots everywhere.
    form.setFieldText("strategy", "hierarchical");
    CHECK_FALSE(form.isValid());
    CHECK(form.errorText().contains("same slots on every host"));
    form.setHostSlots("gpu-b", 2);
    CHECK(form.isValid());
    CHECK(form.target().placement() == "gpu-a:2,gpu-b:2");
    form.setFieldText("strategy", "ring");

    form.setMasterAddr("10.0.0 .2");
    CHECK_FALSE(form.isValid());
    CHECK(form.errorText().contains("master address"));
    form.setMasterAddr("10.0.0.2");
    form.setStageLathectl(true);
    REQUIRE(form.isValid());
    target = form.target();
    CHECK(target.masterAddr == "10.0.0.2");
    CHECK(target.stage);
    form.grab().save(lathe::test::outputPath("run_form_target_hosts.png"));

    // The inventory re-read without gpu-b: the slots chosen on the others stay.
    form.setHosts({host("gpu-a", "10.0.0.2", 2), host("gpu-c", "10.0.0.4", 1)});
    CHECK(form.targetHostNames() == QStringList({"gpu-a", "gpu-c"}));
    CHECK(form.hostSlots("gpu-a") == 2);
    CHECK(form.target().placement() == "gpu-a:2");
    CHECK(form.isValid());  // 2 slots in all
    form.setHostSlots("gpu-c", 1);
    CHECK(form.target().placement() == "gpu-a:2,gpu-c:1");

    // While a run runs the target is fixed.
    form.setRunning(true);
    CHECK_FALSE(form.targetGroup()->isEnabled());
    form.setRunning(false);
    CHECK(form.targetGroup()->isEnabled());

    // Back to this machine: nproc from the form again.
    form.setTargetHosts(false);
    CHECK(form.target().isLocal());
    CHECK(form.isFieldActive("nproc"));
    CHECK(form.spec().nproc == 2);

    // No hosts at all: Hosts says where to add them.
    form.setHosts({});
    form.setTargetHosts(true);
    CHECK_FALSE(form.isValid());
    CHECK(form.errorText().contains("Hosts page"));
}

TEST_CASE("RunTarget names its placement like lathectl train --hosts", "[widgets][form][hosts]") {
    lathe::widgets::RunTarget t;
    CHECK(t.isLocal());
    CHECK(t.totalSlots() == 0);
    CHECK(t.placement().empty());
    t.hosts = {{"gpu-a", 2}, {"gpu-b", 1}};
    CHECK_FALSE(t.isLocal());
    CHECK(t.totalSlots() == 3);
    CHECK(t.placement() == "gpu-a:2,gpu-b:1");
}

TEST_CASE("RunForm offers the workspace's versioned data sets and checks a dataset: reference",
          "[widgets][form][data-versions]") {
    RunForm form;
    auto* combo = qobject_cast<QComboBox*>(form.fieldWidget("data"));
    REQUIRE(combo != nullptr);
    const int builtIn = combo->count();
    form.setDataSets({"pets", "points"});
    REQUIRE(combo->count() == builtIn + 2);
    CHECK(combo->itemText(builtIn) == "dataset:pets");
    combo->setCurrentIndex(builtIn + 1);
    CHECK(form.fieldText("data") == "dataset:points");
    CHECK(form.isValid());
    // Offered again (another workspace): the old ones go, what is typed stays.
    form.setDataSets({"cats"});
    CHECK(combo->count() == builtIn + 1);
    CHECK(combo->itemText(builtIn) == "dataset:cats");
    CHECK(form.fieldText("data") == "dataset:points");
    combo->setEditText("dataset:points:0");
    CHECK_FALSE(form.isValid());
    CHECK(form.fieldError("data").contains("number >= 1"));
    combo->setEditText("dataset:points:2");
    CHECK(form.isValid());
}
