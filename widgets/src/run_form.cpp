#include "lathe/widgets/run_form.h"

#include <QCheckBox>
#include <QComboBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QRadioButton>
#include <QRegularExpression>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QToolButton>
#include <QVBoxLayout>

#include <algorithm>
#include <exception>
#include <map>

namespace lathe::widgets {

namespace {

// The keys an engineer changes on almost every run, in reading order; the rest of the spec
// table goes into the collapsed "Advanced" section so the form stays short.
const char* const kPrimaryKeys[] = {"name", "experiment", "model",  "data", "optimizer",
                                    "lr",   "batch",      "epochs", "seed", "hidden"};

// Mixed precision and the profiler get their own group: they are switched on per run and
// their parameters only matter together.
const char* const kPrecisionKeys[] = {"precision",
                                      "loss_scale",
                                      "loss_scale_init",
                                      "loss_scale_growth",
                                      "loss_scale_backoff",
                                      "loss_scale_growth_interval",
                                      "activation_checkpointing",
                                      "profile",
                                      "profile_wait",
                                      "profile_warmup",
                                      "profile_active",
                                      "profile_repeat"};

// Data-, pipeline- and tensor-parallel training: the world size, the pipeline's stages and
// schedule, the tensor-parallel size, the collective engine, the reducer's bucket size and how
// gradients are compressed on the wire. Chunk, error feedback and stochastic rounding only apply to
// the quantizing codecs (int8/int4).
const char* const kDistributedKeys[] = {
    "nproc",           "pipeline_stages", "micro_batches",  "pipeline_schedule", "balance",
    "tensor_parallel", "backend",         "strategy",       "ranks_per_host",    "ps_ranks",
    "bucket_mb",       "compress",        "error_feedback", "compress_chunk",    "stochastic_rounding"};

bool isPipelineParam(const std::string& key) {
    return key == "micro_batches" || key == "pipeline_schedule" || key == "balance";
}

// The data pipeline: loader, image steps, caches (core/src/data/README.md).
const char* const kDataKeys[] = {"loader_workers", "prefetch",        "resize",        "crop",
                                 "random_crop",    "hflip",           "normalize",     "color",
                                 "bad_samples",    "cache_memory_mb", "cache_disk_gb", "cache_redis",
                                 "cache_redis_ttl"};

bool isDataKey(const std::string& key) {
    return std::any_of(std::begin(kDataKeys), std::end(kDataKeys), [&](const char* k) { return key == k; });
}

bool isQuantizerKey(const std::string& key) {
    return key == "error_feedback" || key == "compress_chunk" || key == "stochastic_rounding";
}

bool isStrategyParam(const std::string& key) { return key == "ranks_per_host" || key == "ps_ranks"; }

bool isDistributedKey(const std::string& key) {
    return std::any_of(std::begin(kDistributedKeys), std::end(kDistributedKeys),
                       [&](const char* k) { return key == k; });
}

bool isPrimary(const std::string& key) {
    return std::any_of(std::begin(kPrimaryKeys), std::end(kPrimaryKeys),
                       [&](const char* k) { return key == k; });
}

bool isPrecisionKey(const std::string& key) {
    return std::any_of(std::begin(kPrecisionKeys), std::end(kPrecisionKeys),
                       [&](const char* k) { return key == k; });
}

bool startsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool parseBool(const QString& text, bool fallback) {
    const QString t = text.trimmed().toLower();
    if (t == QLatin1String("true") || t == QLatin1String("on") || t == QLatin1String("1") ||
        t == QLatin1String("yes"))
        return true;
    if (t == QLatin1String("false") || t == QLatin1String("off") || t == QLatin1String("0") ||
        t == QLatin1String("no"))
        return false;
    return fallback;
}

QString labelFor(const std::string& key) {
    QString s = QString::fromStdString(key);
    s.replace(QLatin1Char('_'), QLatin1Char(' '));
    if (s == QLatin1String("lr")) return QStringLiteral("learning rate");
    if (s == QLatin1String("hidden")) return QStringLiteral("hidden widths");
    if (s == QLatin1String("nproc")) return QStringLiteral("processes");
    if (s == QLatin1String("bucket mb")) return QStringLiteral("bucket size (MB)");
    if (s == QLatin1String("compress")) return QStringLiteral("compression");
    if (s == QLatin1String("compress chunk")) return QStringLiteral("chunk (elements)");
    return s;
}

const char* const kInvalidStyle = "border: 1px solid #d32f2f; border-radius: 2px; background: #fff5f5;";

}  // namespace

RunForm::RunForm(QWidget* parent) : QWidget(parent) {
    const core::RunSpec defaults;
    auto* outer = new QVBoxLayout(this);
    outer->setContentsMargins(0, 0, 0, 0);

    auto* primary = new QFormLayout;
    primary->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    const auto& keys = core::specKeys();
    for (const char* name : kPrimaryKeys) {
        auto it =
            std::find_if(keys.begin(), keys.end(), [&](const core::SpecKey& k) { return k.name == name; });
        if (it != keys.end()) addField(primary, *it, defaults);
    }
    outer->addLayout(primary);

    auto* precisionBox = new QGroupBox(tr("Precision && profiling"), this);
    precisionBox->setObjectName(QStringLiteral("precisionGroup"));
    auto* precisionLayout = new QFormLayout(precisionBox);
    precisionLayout->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    for (const char* name : kPrecisionKeys) {
        auto it =
            std::find_if(keys.begin(), keys.end(), [&](const core::SpecKey& k) { return k.name == name; });
        if (it != keys.end()) addField(precisionLayout, *it, defaults);
    }
    if (precisionLayout->rowCount() > 0)
        outer->addWidget(precisionBox);
    else
        precisionBox->hide();

    buildTarget(outer);

    auto* distributedBox = new QGroupBox(tr("Distributed"), this);
    distributedBox->setObjectName(QStringLiteral("distributedGroup"));
    distributedBox->setToolTip(
        tr("Data-, pipeline- and tensor-parallel training over worker processes (lathectl worker): "
           "processes = replicas x pipeline stages x tensor-parallel ranks"));
    auto* distributedLayout = new QFormLayout(distributedBox);
    distributedLayout->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    for (const char* name : kDistributedKeys) {
        auto it =
            std::find_if(keys.begin(), keys.end(), [&](const core::SpecKey& k) { return k.name == name; });
        if (it != keys.end()) addField(distributedLayout, *it, defaults);
    }
    if (distributedLayout->rowCount() > 0)
        outer->addWidget(distributedBox);
    else
        distributedBox->hide();

    // The data pipeline's keys, folded like Advanced: most runs keep the defaults.
    auto* dataToggle = new QToolButton(this);
    dataToggle->setObjectName(QStringLiteral("dataToggle"));
    dataToggle->setText(tr("Data pipeline"));
    dataToggle->setToolTip(tr("Loader threads, image steps (images:DIR data) and the sample caches"));
    dataToggle->setCheckable(true);
    dataToggle->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
    dataToggle->setArrowType(Qt::RightArrow);
    dataToggle->setAutoRaise(true);
    auto* dataFields = new QWidget(this);
    dataFields->setObjectName(QStringLiteral("dataGroup"));
    auto* dataLayout = new QFormLayout(dataFields);
    dataLayout->setContentsMargins(0, 0, 0, 0);
    dataLayout->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    for (const char* name : kDataKeys) {
        auto it =
            std::find_if(keys.begin(), keys.end(), [&](const core::SpecKey& k) { return k.name == name; });
        if (it != keys.end()) addField(dataLayout, *it, defaults);
    }
    dataFields->setVisible(false);
    connect(dataToggle, &QToolButton::toggled, this, [dataToggle, dataFields](bool on) {
        dataToggle->setArrowType(on ? Qt::DownArrow : Qt::RightArrow);
        dataFields->setVisible(on);
    });
    outer->addWidget(dataToggle);
    outer->addWidget(dataFields);

    // Advanced keys: everything else the spec table knows, so a new core key shows up here
    // without a GUI change.
    auto* toggle = new QToolButton(this);
    toggle->setText(tr("Advanced"));
    toggle->setCheckable(true);
    toggle->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
    toggle->setArrowType(Qt::RightArrow);
    toggle->setAutoRaise(true);
    auto* advanced = new QWidget(this);
    auto* advancedLayout = new QFormLayout(advanced);
    advancedLayout->setContentsMargins(0, 0, 0, 0);
    advancedLayout->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    for (const auto& k : keys)
        if (!isPrimary(k.name) && !isPrecisionKey(k.name) && !isDistributedKey(k.name) && !isDataKey(k.name))
            addField(advancedLayout, k, defaults);
    advanced->setVisible(false);
    connect(toggle, &QToolButton::toggled, this, [toggle, advanced](bool on) {
        toggle->setArrowType(on ? Qt::DownArrow : Qt::RightArrow);
        advanced->setVisible(on);
    });
    if (advancedLayout->rowCount() > 0) {
        outer->addWidget(toggle);
        outer->addWidget(advanced);
    } else {
        toggle->hide();
    }

    m_errors = new QLabel(this);
    m_errors->setWordWrap(true);
    m_errors->setStyleSheet(QStringLiteral("color: #c62828;"));
    m_errors->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_errors->hide();
    outer->addWidget(m_errors);

    auto* buttons = new QHBoxLayout;
    m_start = new QPushButton(tr("Start"), this);
    m_start->setObjectName(QStringLiteral("startButton"));
    m_start->setDefault(true);
    m_stop = new QPushButton(tr("Stop"), this);
    m_stop->setObjectName(QStringLiteral("stopButton"));
    m_stop->setEnabled(false);
    buttons->addStretch(1);
    buttons->addWidget(m_start);
    buttons->addWidget(m_stop);
    outer->addLayout(buttons);
    outer->addStretch(1);

    connect(m_start, &QPushButton::clicked, this, &RunForm::onStartClicked);
    connect(m_stop, &QPushButton::clicked, this, &RunForm::stopRequested);

    revalidate();
}

void RunForm::addField(QFormLayout* layout, const core::SpecKey& key, const core::RunSpec& defaults) {
    Field f;
    f.key = key;
    const QString name = QString::fromStdString(key.name);
    const QString value = QString::fromStdString(core::specValue(defaults, key.name));
    QWidget* widget = nullptr;

    if (key.kind == "bool") {
        // A short text widens the click target without widening the form; the help line is
        // the tooltip like every other field's.
        f.check = new QCheckBox(tr("enabled"), this);
        f.check->setSizePolicy(QSizePolicy::Fixed, QSizePolicy::Fixed);
        f.check->setChecked(parseBool(value, false));
        connect(f.check, &QCheckBox::toggled, this, &RunForm::revalidate);
        widget = f.check;
    } else if (key.kind == "choice" && !key.choices.empty()) {
        f.combo = new QComboBox(this);
        for (const auto& c : key.choices) f.combo->addItem(QString::fromStdString(c));
        f.combo->setCurrentText(value);
        connect(f.combo, &QComboBox::currentTextChanged, this, &RunForm::revalidate);
        widget = f.combo;
    } else if (key.name == "data") {
        // Free text with the common sources offered; csv:/idx: need a path typed or browsed.
        f.combo = new QComboBox(this);
        f.combo->setEditable(true);
        f.combo->setInsertPolicy(QComboBox::NoInsert);
        f.combo->addItems({QStringLiteral("digits"), QStringLiteral("synthetic:spirals"),
                           QStringLiteral("csv:"), QStringLiteral("idx:")});
        f.combo->setEditText(value);
        f.edit = f.combo->lineEdit();
        connect(f.edit, &QLineEdit::textChanged, this, &RunForm::revalidate);
        auto* browse = new QToolButton(this);
        browse->setText(QStringLiteral("…"));
        browse->setToolTip(tr("Choose a CSV file"));
        QComboBox* combo = f.combo;
        connect(browse, &QToolButton::clicked, this, [this, combo] {
            const QString file = QFileDialog::getOpenFileName(this, tr("CSV data set"), {},
                                                              tr("CSV (*.csv *.csv.gz);;All files (*)"));
            if (!file.isEmpty()) combo->setEditText(QStringLiteral("csv:") + file);
        });
        auto* row = new QWidget(this);
        auto* h = new QHBoxLayout(row);
        h->setContentsMargins(0, 0, 0, 0);
        h->addWidget(f.combo, 1);
        h->addWidget(browse);
        widget = row;
    } else {
        f.edit = new QLineEdit(this);
        f.edit->setText(value);
        if (key.name == "name") f.edit->setPlaceholderText(tr("generated"));
        connect(f.edit, &QLineEdit::textChanged, this, &RunForm::revalidate);
        widget = f.edit;
    }
    QWidget* target = widgetOf(f);
    target->setObjectName(name);
    target->setToolTip(QString::fromStdString(key.help));
    target->setAccessibleName(labelFor(key.name));

    auto* label = new QLabel(labelFor(key.name), this);
    label->setToolTip(QString::fromStdString(key.help));
    label->setBuddy(target);
    layout->addRow(label, widget);

    m_index[name] = m_fields.size();
    m_fields.push_back(std::move(f));
}

QWidget* RunForm::widgetOf(const Field& f) const {
    if (f.check) return f.check;
    if (f.combo) return f.combo;
    return f.edit;
}

QString RunForm::textOf(const Field& f) const {
    if (f.check) return f.check->isChecked() ? QStringLiteral("true") : QStringLiteral("false");
    if (f.edit) return f.edit->text().trimmed();
    if (f.combo) return f.combo->currentText();
    return {};
}

core::RunSpec RunForm::spec() const {
    core::RunSpec s;
    for (const auto& f : m_fields) {
        const QString text = textOf(f);
        if (f.key.name == "name" && text.isEmpty()) continue;  // empty name = core generates one
        // A greyed quantizer field has no effect and is not validated: keep the default so a
        // half-typed chunk never fails the cross-field checks of an uncompressed run. The same
        // for processes when the hosts' slots decide them.
        if (f.inactive &&
            (isQuantizerKey(f.key.name) || isStrategyParam(f.key.name) || f.key.name == "nproc"))
            continue;
        try {
            core::setSpecValue(s, f.key.name, text.toStdString());
        } catch (const std::exception&) {
            // isValid() is false in this case; the caller must not start such a spec.
        }
    }
    if (isTargetHosts()) {
        const int total = target().totalSlots();
        if (total > 0) s.nproc = total;
    }
    return s;
}

void RunForm::setSpec(const core::RunSpec& spec) {
    for (auto& f : m_fields) {
        const QString value = QString::fromStdString(core::specValue(spec, f.key.name));
        if (f.check)
            f.check->setChecked(parseBool(value, f.check->isChecked()));
        else if (f.combo && !f.edit)
            f.combo->setCurrentText(value);
        else if (f.combo)
            f.combo->setEditText(value);
        else
            f.edit->setText(value);
    }
    revalidate();
}

bool RunForm::isValid() const { return m_valid; }

bool RunForm::hasField(const QString& key) const { return m_index.count(key) != 0; }

QString RunForm::fieldText(const QString& key) const {
    auto it = m_index.find(key);
    return it == m_index.end() ? QString() : textOf(m_fields[it->second]);
}

void RunForm::setFieldText(const QString& key, const QString& text) {
    auto it = m_index.find(key);
    if (it == m_index.end()) return;
    Field& f = m_fields[it->second];
    if (f.check)
        f.check->setChecked(parseBool(text, f.check->isChecked()));
    else if (f.combo && !f.edit)
        f.combo->setCurrentText(text);
    else if (f.combo)
        f.combo->setEditText(text);
    else
        f.edit->setText(text);
    revalidate();  // setText with an unchanged value emits nothing
}

QString RunForm::fieldError(const QString& key) const {
    auto it = m_index.find(key);
    return it == m_index.end() ? QString() : m_fields[it->second].error;
}

QWidget* RunForm::fieldWidget(const QString& key) const {
    auto it = m_index.find(key);
    return it == m_index.end() ? nullptr : widgetOf(m_fields[it->second]);
}

bool RunForm::isFieldActive(const QString& key) const {
    auto it = m_index.find(key);
    return it != m_index.end() && !m_fields[it->second].inactive;
}

QString RunForm::errorText() const { return m_errors->text(); }

void RunForm::applyFieldStyle(Field& f) {
    QWidget* w = widgetOf(f);
    if (f.error.isEmpty()) {
        w->setStyleSheet({});
        w->setToolTip(QString::fromStdString(f.key.help));
    } else {
        w->setStyleSheet(QString::fromLatin1(kInvalidStyle));
        w->setToolTip(f.error);
    }
}

void RunForm::updateDependentFields() {
    // The profile schedule only matters with Profile on; the dynamic scaler's parameters only
    // with a loss-scale mode that resolves to dynamic (core decides what "auto" means).
    const bool profiling = parseBool(fieldText(QStringLiteral("profile")), false);
    bool dynamicScale = false;
    try {
        core::RunSpec s;
        core::setSpecValue(s, "precision", fieldText(QStringLiteral("precision")).toStdString());
        core::setSpecValue(s, "loss_scale", fieldText(QStringLiteral("loss_scale")).toStdString());
        dynamicScale = core::lossScaleMode(s).kind == core::LossScaleMode::Kind::Dynamic;
    } catch (const std::exception&) {
        dynamicScale = true;  // while the mode does not parse, leave its parameters editable
    }
    const QString codec = fieldText(QStringLiteral("compress"));
    const bool quantizing = codec == QLatin1String("int8") || codec == QLatin1String("int4");
    const QString strategy = fieldText(QStringLiteral("strategy"));
    const bool teacherless = fieldText(QStringLiteral("teacher")).trimmed().isEmpty();
    const bool pipelined = fieldText(QStringLiteral("pipeline_stages")).trimmed().toLongLong() > 1;
    for (auto& f : m_fields) {
        bool inactive = false;
        if (startsWith(f.key.name, "profile_")) inactive = !profiling;
        if (isQuantizerKey(f.key.name)) inactive = !quantizing;
        // Each exchange strategy's own parameter.
        if (f.key.name == "ranks_per_host") inactive = strategy != QLatin1String("hierarchical");
        if (f.key.name == "ps_ranks") inactive = strategy != QLatin1String("ps");
        // The pipeline's micro-batches, schedule and balance only matter with stages.
        if (isPipelineParam(f.key.name)) inactive = !pipelined;
        // Across hosts the ranks are the slots chosen under Target.
        if (f.key.name == "nproc") inactive = isTargetHosts();
        if (startsWith(f.key.name, "loss_scale_")) inactive = !dynamicScale;
        // Distillation's settings only matter with a teacher.
        if (startsWith(f.key.name, "distill_") || f.key.name == "hint_weight" ||
            f.key.name == "attention_transfer")
            inactive = teacherless;
        if (inactive != f.inactive) {
            f.inactive = inactive;
            applyEnabled(f);
        }
    }
}

void RunForm::applyEnabled(Field& f) {
    QWidget* w = widgetOf(f);
    w->setEnabled(!m_running && !f.inactive);
}

void RunForm::revalidate() {
    if (hasField(QStringLiteral("profile")) || hasField(QStringLiteral("loss_scale")) ||
        hasField(QStringLiteral("compress")) || hasField(QStringLiteral("strategy")))
        updateDependentFields();
    QStringList messages;
    for (auto& f : m_fields) {
        const QString text = textOf(f);
        std::string msg;
        if (!(f.key.name == "name" && text.isEmpty()) && !f.inactive) {
            try {
                msg = core::checkSpecValue(f.key.name, text.toStdString());
            } catch (const std::exception& e) {
                msg = e.what();
            }
        }
        const QString error = QString::fromStdString(msg);
        if (error != f.error || error.isEmpty()) {
            f.error = error;
            applyFieldStyle(f);
        }
        if (!error.isEmpty()) messages << error;
    }
    messages << targetMessages();
    // Cross-field rules (e.g. warm-up longer than the run) only make sense once every field
    // parses on its own.
    if (messages.isEmpty()) {
        try {
            for (const auto& m : core::validate(spec())) messages << QString::fromStdString(m);
        } catch (const std::exception& e) {
            messages << QString::fromUtf8(e.what());
        }
    }
    m_errors->setText(messages.join(QLatin1Char('\n')));
    m_errors->setVisible(!messages.isEmpty());

    const bool valid = messages.isEmpty();
    m_start->setEnabled(valid && !m_running);
    if (valid != m_valid) {
        m_valid = valid;
        Q_EMIT validityChanged(valid);
    }
}

void RunForm::setRunning(bool running) {
    m_running = running;
    // The spec of a running run is fixed; greying the fields says so.
    for (auto& f : m_fields) applyEnabled(f);
    m_targetBox->setEnabled(!running);
    m_start->setEnabled(m_valid && !running);
    m_stop->setEnabled(running);
}

void RunForm::onStartClicked() {
    revalidate();
    if (!m_valid || m_running) return;
    Q_EMIT startRequested(spec());
}

// ---- Target ------------------------------------------------------------------------------

void RunForm::buildTarget(QVBoxLayout* outer) {
    m_targetBox = new QGroupBox(tr("Target"), this);
    m_targetBox->setObjectName(QStringLiteral("targetGroup"));
    m_targetBox->setToolTip(
        tr("Where the ranks run: here, or on hosts of this workspace over SSH (Hosts page)"));
    auto* layout = new QVBoxLayout(m_targetBox);
    auto* choice = new QHBoxLayout;
    m_targetLocal = new QRadioButton(tr("This machine"), m_targetBox);
    m_targetLocal->setObjectName(QStringLiteral("targetLocal"));
    m_targetLocal->setChecked(true);
    m_targetHosts = new QRadioButton(tr("Hosts"), m_targetBox);
    m_targetHosts->setObjectName(QStringLiteral("targetHosts"));
    m_targetHosts->setToolTip(
        tr("One rank per slot on the chosen hosts, started over SSH "
           "(lathectl train --hosts NAME:SLOTS,…)"));
    choice->addWidget(m_targetLocal);
    choice->addWidget(m_targetHosts);
    choice->addStretch(1);
    layout->addLayout(choice);

    m_hostsPanel = new QWidget(m_targetBox);
    m_hostsPanelLayout = new QVBoxLayout(m_hostsPanel);
    m_hostsPanelLayout->setContentsMargins(0, 0, 0, 0);
    m_hostRowsWidget = new QWidget(m_hostsPanel);
    m_hostsPanelLayout->addWidget(m_hostRowsWidget);
    m_noHosts = new QLabel(tr("No hosts in this workspace: add them on the Hosts page."), m_hostsPanel);
    m_noHosts->setWordWrap(true);
    m_hostsPanelLayout->addWidget(m_noHosts);
    auto* extra = new QFormLayout;
    extra->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    m_masterAddr = new QLineEdit(m_hostsPanel);
    m_masterAddr->setObjectName(QStringLiteral("masterAddr"));
    m_masterAddr->setPlaceholderText(tr("the first host's address"));
    m_masterAddr->setToolTip(
        tr("The address of the first host that the other hosts reach (rank 0's "
           "rendezvous); empty: the address this machine reaches it at"));
    extra->addRow(tr("master address"), m_masterAddr);
    m_stage = new QCheckBox(tr("stage lathectl"), m_hostsPanel);
    m_stage->setObjectName(QStringLiteral("stageLathectl"));
    m_stage->setToolTip(
        tr("Upload this lathectl to hosts of the same OS and architecture that lack it or have "
           "another version"));
    extra->addRow(QString(), m_stage);
    m_hostsPanelLayout->addLayout(extra);
    m_targetSummary = new QLabel(m_hostsPanel);
    m_targetSummary->setObjectName(QStringLiteral("targetSummary"));
    m_targetSummary->setWordWrap(true);
    m_hostsPanelLayout->addWidget(m_targetSummary);
    layout->addWidget(m_hostsPanel);
    outer->addWidget(m_targetBox);

    connect(m_targetHosts, &QRadioButton::toggled, this, [this] {
        updateTarget();
        revalidate();
    });
    connect(m_masterAddr, &QLineEdit::textChanged, this, &RunForm::revalidate);
    rebuildHostRows();
    updateTarget();
}

void RunForm::setDataSets(const QStringList& names) {
    const auto it = m_index.find(QStringLiteral("data"));
    if (it == m_index.end() || !m_fields[it->second].combo) return;
    QComboBox* combo = m_fields[it->second].combo;
    const QString text = combo->currentText();
    const QSignalBlocker block(combo);
    for (int i = combo->count() - 1; i >= 0; --i)
        if (combo->itemText(i).startsWith(QStringLiteral("dataset:"))) combo->removeItem(i);
    for (const auto& n : names) combo->addItem(QStringLiteral("dataset:") + n);
    combo->setEditText(text);
}

void RunForm::setHosts(const std::vector<core::HostRecord>& hosts) {
    std::map<std::string, int> chosen;
    for (const auto& row : m_hostRows) chosen[row.name] = row.slots->value();
    m_inventory = hosts;
    rebuildHostRows();
    for (auto& row : m_hostRows)
        if (auto it = chosen.find(row.name); it != chosen.end())
            row.slots->setValue(std::min(it->second, row.maxSlots));
    updateTarget();
    revalidate();
}

void RunForm::rebuildHostRows() {
    // A fresh container: the rows of the previous inventory go with the old one.
    auto* rows = new QWidget(m_hostsPanel);
    auto* form = new QFormLayout(rows);
    form->setContentsMargins(0, 0, 0, 0);
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    m_hostRows.clear();
    for (const auto& h : m_inventory) {
        HostRow row;
        row.name = h.name;
        row.maxSlots = std::max(1, h.slots);
        row.slots = new QSpinBox(rows);
        row.slots->setObjectName(QStringLiteral("slots:") + QString::fromStdString(h.name));
        row.slots->setRange(0, row.maxSlots);
        row.slots->setSpecialValueText(tr("not used"));
        row.slots->setSuffix(tr(" of %1").arg(row.maxSlots));
        row.slots->setToolTip(tr("Ranks to start on %1 (%2), at most its slots (%3)")
                                  .arg(QString::fromStdString(h.name), QString::fromStdString(h.address),
                                       QString::number(row.maxSlots)));
        connect(row.slots, &QSpinBox::valueChanged, this, [this] {
            updateTarget();
            revalidate();
        });
        auto* label = new QLabel(QString::fromStdString(h.name), rows);
        label->setToolTip(row.slots->toolTip());
        label->setBuddy(row.slots);
        form->addRow(label, row.slots);
        m_hostRows.push_back(row);
    }
    m_hostsPanelLayout->replaceWidget(m_hostRowsWidget, rows);
    delete m_hostRowsWidget;
    m_hostRowsWidget = rows;
    m_noHosts->setVisible(m_inventory.empty());
}

void RunForm::updateTarget() {
    m_hostsPanel->setVisible(isTargetHosts());
    const RunTarget t = target();
    if (!isTargetHosts())
        m_targetSummary->clear();
    else if (t.totalSlots() == 0)
        m_targetSummary->setText(tr("Choose the slots to use on one or more hosts."));
    else
        m_targetSummary->setText(tr("%1 %2 on %3")
                                     .arg(QString::number(t.totalSlots()),
                                          t.totalSlots() == 1 ? tr("rank") : tr("ranks"),
                                          QString::fromStdString(t.placement())));
}

void RunForm::setTargetHosts(bool hosts) {
    if (hosts)
        m_targetHosts->setChecked(true);
    else
        m_targetLocal->setChecked(true);
}

bool RunForm::isTargetHosts() const { return m_targetHosts && m_targetHosts->isChecked(); }

QStringList RunForm::targetHostNames() const {
    QStringList names;
    for (const auto& row : m_hostRows) names << QString::fromStdString(row.name);
    return names;
}

bool RunForm::setHostSlots(const QString& host, int slots) {
    QSpinBox* box = hostSlotsBox(host);
    if (!box) return false;
    box->setValue(slots);
    return true;
}

int RunForm::hostSlots(const QString& host) const {
    QSpinBox* box = hostSlotsBox(host);
    return box ? box->value() : 0;
}

QSpinBox* RunForm::hostSlotsBox(const QString& host) const {
    const std::string name = host.toStdString();
    for (const auto& row : m_hostRows)
        if (row.name == name) return row.slots;
    return nullptr;
}

void RunForm::setMasterAddr(const QString& address) { m_masterAddr->setText(address); }

void RunForm::setStageLathectl(bool stage) { m_stage->setChecked(stage); }

RunTarget RunForm::target() const {
    RunTarget t;
    if (!isTargetHosts()) return t;
    for (const auto& row : m_hostRows)
        if (row.slots->value() > 0) t.hosts.push_back({row.name, row.slots->value()});
    t.masterAddr = m_masterAddr->text().trimmed().toStdString();
    t.stage = m_stage->isChecked();
    return t;
}

QString RunForm::targetSummary() const { return m_targetSummary->text(); }

QStringList RunForm::targetMessages() const {
    QStringList out;
    if (!isTargetHosts()) return out;
    const RunTarget t = target();
    if (m_inventory.empty()) {
        out << tr("Target: no hosts in this workspace; add them on the Hosts page, or choose This machine");
        return out;
    }
    if (t.totalSlots() < 2)
        out << tr("Target: a run across hosts needs at least 2 slots in all (one rank per slot)");
    if (fieldText(QStringLiteral("strategy")) == QLatin1String("hierarchical")) {
        for (const auto& h : t.hosts)
            if (h.slots != t.hosts.front().slots) {
                out << tr("Target: strategy \"hierarchical\" groups ranks by host and needs the same slots "
                          "on "
                          "every host (got %1)")
                           .arg(QString::fromStdString(t.placement()));
                break;
            }
    }
    const QString master = m_masterAddr->text().trimmed();
    if (master.startsWith(QLatin1Char('-')) || master.contains(QRegularExpression(QStringLiteral("\\s"))))
        out << tr(
            "Target: the master address must be a host name or an address (no spaces, not starting with "
            "'-')");
    return out;
}

}  // namespace lathe::widgets
