#include "lathe/widgets/study_dialog.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDateTime>
#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QTableWidget>
#include <QThread>
#include <QVBoxLayout>

#include <nlohmann/json.hpp>
#include <set>

#include "lathe/core/error.h"
#include "lathe/core/tuner.h"

namespace lathe::widgets {

namespace {

const QStringList kKinds = {"loguniform", "uniform", "int", "logint", "choice"};

// The keys a study can search: every run-spec key but those that name files or places, or
// steer the study itself.
QStringList searchableKeys() {
    static const std::set<std::string> skip = {"name",   "experiment",   "data",
                                               "device", "ppo_policy",   "teacher",
                                               "hosts",  "label_column", "cache_redis"};
    QStringList keys;
    for (const auto& k : core::specKeys())
        if (!skip.count(k.name) && k.kind != "string") keys << QString::fromStdString(k.name);
    return keys;
}

// "1e-4, 0.1" → "1e-4,0.1"; "[64], [128, 128]" → "[64],[128,128]" (spaces dropped).
QString compact(const QString& text) {
    QString out;
    for (const QChar c : text)
        if (!c.isSpace()) out += c;
    return out;
}

}  // namespace

StudyDialog::StudyDialog(const core::RunSpec& base, const QStringList& existing, QWidget* parent)
    : QDialog(parent), m_base(base), m_existing(existing) {
    setWindowTitle(tr("New study"));
    setObjectName(QStringLiteral("studyDialog"));

    m_baseLabel = new QLabel(this);
    m_baseLabel->setWordWrap(true);
    m_baseLabel->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_baseLabel->setText(tr("Each trial is a run of the run form's configuration (%1 on %2, %3 epochs) "
                            "with the searched keys set to the trial's values.")
                             .arg(QString::fromStdString(base.model), QString::fromStdString(base.data))
                             .arg(base.epochs));

    m_name = new QLineEdit(this);
    m_name->setObjectName(QStringLiteral("studyName"));
    m_name->setText(QStringLiteral("study-") + QDateTime::currentDateTime().toString("yyyyMMdd-HHmmss"));
    m_name->setToolTip(
        tr("Letters, digits, '-', '_' and '.'; the trials' runs go into the experiment of "
           "this name"));

    m_space = new QTableWidget(0, SpaceColumnCount, this);
    m_space->setObjectName(QStringLiteral("studySpace"));
    m_space->setHorizontalHeaderLabels({tr("Key"), tr("Distribution"), tr("Bounds or choices")});
    m_space->horizontalHeader()->setStretchLastSection(true);
    m_space->verticalHeader()->setVisible(false);
    m_space->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_space->setToolTip(
        tr("Bounds: A, B (log kinds need A > 0). Choices: V1, V2, … — a list value in "
           "brackets, e.g. [64], [128,128] for hidden"));
    auto* add = new QPushButton(tr("Add key"), this);
    add->setObjectName(QStringLiteral("addSpaceRow"));
    auto* remove = new QPushButton(tr("Remove"), this);
    remove->setObjectName(QStringLiteral("removeSpaceRow"));
    connect(add, &QPushButton::clicked, this,
            [this] { addSpaceRow(QStringLiteral("momentum"), "uniform", "0, 0.99"); });
    connect(remove, &QPushButton::clicked, this, [this] {
        const int row = m_space->currentRow();
        if (row >= 0) m_space->removeRow(row);
        revalidate();
    });
    connect(m_space, &QTableWidget::itemChanged, this, [this] { revalidate(); });

    m_objective = new QComboBox(this);
    m_objective->setObjectName(QStringLiteral("studyObjective"));
    for (const auto& k : core::objectiveMetrics()) m_objective->addItem(QString::fromStdString(k));
    m_direction = new QComboBox(this);
    m_direction->setObjectName(QStringLiteral("studyDirection"));
    m_direction->addItem(tr("maximise"), QStringLiteral("max"));
    m_direction->addItem(tr("minimise"), QStringLiteral("min"));
    connect(m_objective, &QComboBox::currentTextChanged, this, [this](const QString& key) {
        // Losses and step times go down; accuracies and throughput up.
        const bool lower = key.endsWith(QLatin1String("loss")) || key == QLatin1String("perf/step_ms");
        m_direction->setCurrentIndex(lower ? 1 : 0);
        revalidate();
    });
    connect(m_direction, &QComboBox::currentIndexChanged, this, [this] { revalidate(); });

    m_trials = new QSpinBox(this);
    m_trials->setObjectName(QStringLiteral("studyTrials"));
    m_trials->setRange(1, 100000);
    m_trials->setValue(20);
    m_parallel = new QSpinBox(this);
    m_parallel->setObjectName(QStringLiteral("studyParallel"));
    m_parallel->setRange(1, 256);
    m_parallel->setValue(std::max(1, QThread::idealThreadCount() / 2));
    m_parallel->setToolTip(
        tr("Trials at a time, each a process of its own; they share this machine's cores"));

    m_algorithm = new QComboBox(this);
    m_algorithm->setObjectName(QStringLiteral("studyAlgorithm"));
    m_algorithm->addItem(tr("TPE (tree-structured Parzen estimator)"), QStringLiteral("tpe"));
    m_algorithm->addItem(tr("Random search"), QStringLiteral("random"));
    m_algorithm->addItem(tr("ASHA (random search, early stopping)"), QStringLiteral("asha"));
    m_algorithm->addItem(tr("PPO agent (changes lr and batch during each run)"), QStringLiteral("ppo"));
    m_asha = new QCheckBox(tr("Stop poor trials early (ASHA over epochs)"), this);
    m_asha->setObjectName(QStringLiteral("studyAsha"));
    m_minBudget = new QDoubleSpinBox(this);
    m_minBudget->setObjectName(QStringLiteral("studyMinBudget"));
    m_minBudget->setDecimals(0);
    m_minBudget->setRange(1, 100000);
    m_minBudget->setValue(1);
    m_minBudget->setSuffix(tr(" epochs"));
    m_minBudget->setToolTip(tr("ASHA's first rung: every trial runs at least this long"));
    m_eta = new QSpinBox(this);
    m_eta->setObjectName(QStringLiteral("studyEta"));
    m_eta->setRange(2, 16);
    m_eta->setValue(3);
    m_eta->setToolTip(tr("ASHA keeps the best 1/eta of the trials at each rung"));
    m_seed = new QSpinBox(this);
    m_seed->setObjectName(QStringLiteral("studySeed"));
    m_seed->setRange(0, 1000000);
    m_seed->setToolTip(tr("The sampler's seed (the runs keep the configuration's own seed)"));
    connect(m_algorithm, &QComboBox::currentIndexChanged, this, [this] {
        updateEnabled();
        revalidate();
    });
    connect(m_asha, &QCheckBox::toggled, this, [this] {
        updateEnabled();
        revalidate();
    });
    for (auto* box : {m_trials, m_parallel, m_eta, m_seed})
        connect(box, &QSpinBox::valueChanged, this, [this] { revalidate(); });
    connect(m_minBudget, &QDoubleSpinBox::valueChanged, this, [this] { revalidate(); });
    connect(m_name, &QLineEdit::textChanged, this, [this] { revalidate(); });

    auto* spaceButtons = new QHBoxLayout;
    spaceButtons->addWidget(add);
    spaceButtons->addWidget(remove);
    spaceButtons->addStretch(1);
    auto* asha = new QHBoxLayout;
    asha->addWidget(m_asha);
    asha->addWidget(new QLabel(tr("from"), this));
    asha->addWidget(m_minBudget);
    asha->addWidget(new QLabel(tr("eta"), this));
    asha->addWidget(m_eta);
    asha->addStretch(1);
    auto* objective = new QHBoxLayout;
    objective->addWidget(m_objective, 1);
    objective->addWidget(m_direction);

    auto* form = new QFormLayout;
    form->addRow(tr("Name"), m_name);
    form->addRow(tr("Objective"), objective);
    form->addRow(tr("Trials"), m_trials);
    form->addRow(tr("At a time"), m_parallel);
    form->addRow(tr("Algorithm"), m_algorithm);
    form->addRow(QString(), asha);
    form->addRow(tr("Sampler seed"), m_seed);

    m_problemLabel = new QLabel(this);
    m_problemLabel->setObjectName(QStringLiteral("studyProblem"));
    m_problemLabel->setWordWrap(true);
    m_problemLabel->setStyleSheet(QStringLiteral("color: #b00020"));
    m_problemLabel->setTextInteractionFlags(Qt::TextSelectableByMouse);

    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Cancel, this);
    m_start = buttons->addButton(tr("Start study"), QDialogButtonBox::AcceptRole);
    m_start->setObjectName(QStringLiteral("startStudyButton"));
    connect(buttons, &QDialogButtonBox::accepted, this, [this] {
        revalidate();
        if (m_problem.isEmpty()) accept();
    });
    connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);

    auto* layout = new QVBoxLayout(this);
    layout->addWidget(m_baseLabel);
    layout->addWidget(new QLabel(tr("Search space"), this));
    layout->addWidget(m_space, 1);
    layout->addLayout(spaceButtons);
    layout->addLayout(form);
    layout->addWidget(m_problemLabel);
    layout->addWidget(buttons);
    resize(640, 560);

    // A start most studies share: the learning rate on a log scale and the batch size.
    addSpaceRow(QStringLiteral("lr"), QStringLiteral("loguniform"), QStringLiteral("1e-4, 1e-1"));
    addSpaceRow(QStringLiteral("batch"), QStringLiteral("choice"), QStringLiteral("32, 64, 128"));
    m_minBudget->setValue(std::max<double>(1, static_cast<double>(base.epochs) / 9));
    updateEnabled();
    revalidate();
}

void StudyDialog::addSpaceRow(const QString& key, const QString& kind, const QString& values) {
    const QSignalBlocker block(m_space);
    const int row = m_space->rowCount();
    m_space->insertRow(row);
    auto* keyBox = new QComboBox(m_space);
    keyBox->setEditable(true);
    keyBox->addItems(searchableKeys());
    keyBox->setCurrentText(key);
    auto* kindBox = new QComboBox(m_space);
    kindBox->addItems(kKinds);
    kindBox->setCurrentText(kind);
    m_space->setCellWidget(row, ColKey, keyBox);
    m_space->setCellWidget(row, ColKind, kindBox);
    m_space->setItem(row, ColValues, new QTableWidgetItem(values));
    connect(keyBox, &QComboBox::currentTextChanged, this, [this] { revalidate(); });
    connect(kindBox, &QComboBox::currentTextChanged, this, [this] { revalidate(); });
    revalidate();
}

void StudyDialog::clearSpace() {
    m_space->setRowCount(0);
    revalidate();
}

QStringList StudyDialog::spaceEntries() const {
    QStringList out;
    for (int r = 0; r < m_space->rowCount(); ++r) {
        const auto* key = qobject_cast<QComboBox*>(m_space->cellWidget(r, ColKey));
        const auto* kind = qobject_cast<QComboBox*>(m_space->cellWidget(r, ColKind));
        const auto* values = m_space->item(r, ColValues);
        if (!key || !kind) continue;
        out << QStringLiteral("%1=%2(%3)")
                   .arg(key->currentText().trimmed(), kind->currentText(),
                        compact(values ? values->text() : QString()));
    }
    return out;
}

core::StudyRecord StudyDialog::study() const {
    core::StudyRecord s;
    s.name = m_name->text().trimmed().toStdString();
    s.objective = m_objective->currentText().toStdString();
    s.direction = m_direction->currentData().toString().toStdString();
    const QString algo = m_algorithm->currentData().toString();
    s.sampler = algo == QLatin1String("asha") ? "random" : algo.toStdString();
    s.pruner = algo == QLatin1String("asha") || m_asha->isChecked() ? "asha" : "none";
    for (const auto& e : spaceEntries()) s.space.push_back(e.toStdString());
    s.baseConfig = core::toToml(m_base);
    const nlohmann::json settings{{"trials", m_trials->value()},
                                  {"parallel", m_parallel->value()},
                                  {"seed", m_seed->value()},
                                  {"budget_key", "epochs"},
                                  {"min_budget", m_minBudget->value()},
                                  {"max_budget", static_cast<double>(m_base.epochs)},
                                  {"eta", m_eta->value()},
                                  {"ppo_interval", m_base.ppoInterval},
                                  {"startup_trials", 10}};
    s.settings = settings.dump();
    return s;
}

QStringList StudyDialog::tuneArguments() const {
    const auto s = study();
    QStringList args{QStringLiteral("--study"), QString::fromStdString(s.name)};
    for (const auto& e : s.space) args << QStringLiteral("--space") << QString::fromStdString(e);
    args << QStringLiteral("--objective") << QString::fromStdString(s.objective)
         << QStringLiteral("--direction") << QString::fromStdString(s.direction) << QStringLiteral("--trials")
         << QString::number(m_trials->value()) << QStringLiteral("--parallel")
         << QString::number(m_parallel->value()) << QStringLiteral("--algo")
         << m_algorithm->currentData().toString() << QStringLiteral("--study-seed")
         << QString::number(m_seed->value());
    if (s.pruner == "asha")
        args << QStringLiteral("--pruner") << QStringLiteral("asha") << QStringLiteral("--min-budget")
             << QString::number(m_minBudget->value()) << QStringLiteral("--eta")
             << QString::number(m_eta->value());
    return args;
}

void StudyDialog::updateEnabled() {
    const bool ashaAlgo = m_algorithm->currentData().toString() == QLatin1String("asha");
    if (ashaAlgo) m_asha->setChecked(true);
    m_asha->setEnabled(!ashaAlgo);
    const bool pruning = m_asha->isChecked();
    m_minBudget->setEnabled(pruning);
    m_eta->setEnabled(pruning);
}

void StudyDialog::revalidate() {
    QString problem;
    const QString name = m_name->text().trimmed();
    if (m_existing.contains(name)) {
        problem = tr("The workspace has a study named %1 already: choose another name, or resume that one "
                     "from the Studies page.")
                      .arg(name);
    } else {
        try {
            core::checkStudy(study(), m_base);
        } catch (const core::Error& e) {
            problem = QString::fromUtf8(e.what());
        }
    }
    m_problem = problem;
    m_problemLabel->setText(problem);
    m_problemLabel->setVisible(!problem.isEmpty());
    m_start->setEnabled(problem.isEmpty());
}

}  // namespace lathe::widgets
