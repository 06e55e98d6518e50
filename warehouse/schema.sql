-- prompt-r1 warehouse schema (DuckDB). Applied idempotently on every connect.
-- The durable record of what happened: questions in, trajectories and environment calls out,
-- evaluation rows per (run, environment, method, dataset, question).

CREATE TABLE IF NOT EXISTS sources (
    source_file   VARCHAR NOT NULL,     -- resolved path (hf:NAME:... for HF datasets); its latest version only
    content_hash  VARCHAR PRIMARY KEY,  -- sha256 of the file bytes + how they map to questions
    dataset       VARCHAR NOT NULL,
    n_questions   INTEGER NOT NULL,
    ingested_at   TIMESTAMP NOT NULL
);

CREATE TABLE IF NOT EXISTS questions (
    question_id     VARCHAR PRIMARY KEY,   -- hash of (dataset, split, row key): one per source row
    dataset         VARCHAR NOT NULL,
    split           VARCHAR NOT NULL,      -- train / test / ood
    question        VARCHAR NOT NULL,      -- without the instruction template
    golds           VARCHAR[] NOT NULL,
    task_family     VARCHAR NOT NULL,      -- multihop_qa / standard_qa / math / generation
    primary_metric  VARCHAR NOT NULL,      -- f1 / em / ssim
    source_file     VARCHAR NOT NULL,
    source_hash     VARCHAR NOT NULL,
    row_index       INTEGER NOT NULL,      -- position in its source (records, blank lines not counted)
    ingested_at     TIMESTAMP NOT NULL
);

CREATE TABLE IF NOT EXISTS trajectories (
    run_id          VARCHAR NOT NULL,
    step            INTEGER NOT NULL,
    question_id     VARCHAR NOT NULL,
    group_index     INTEGER NOT NULL,
    token_ids       INTEGER[] NOT NULL,
    loss_mask       TINYINT[] NOT NULL,
    agent_turns     VARCHAR[] NOT NULL,
    env_replies     VARCHAR[] NOT NULL,
    answer          VARCHAR NOT NULL,
    reward_format   DOUBLE,                -- the three rewards are NULL when `error` is set
    reward_answer   DOUBLE,
    reward_total    DOUBLE,
    num_turns       INTEGER NOT NULL,
    stop_reason     VARCHAR NOT NULL,
    created_at      TIMESTAMP NOT NULL,
    error           VARCHAR,               -- a failed environment call ended it (stop_reason env_error)
    policy_version  INTEGER,               -- GRPO updates in the weights that sampled it (NULL: recorded before versions)
    env_name        VARCHAR,               -- the environment it prompted (NULL: recorded before training pools)
    PRIMARY KEY (run_id, step, question_id, group_index)
);

CREATE TABLE IF NOT EXISTS env_calls (
    run_id             VARCHAR NOT NULL,
    step               INTEGER NOT NULL,
    question_id        VARCHAR NOT NULL,
    group_index        INTEGER NOT NULL,
    turn               INTEGER NOT NULL,
    env_name           VARCHAR NOT NULL,
    model              VARCHAR NOT NULL,
    prompt_tokens      INTEGER NOT NULL,
    completion_tokens  INTEGER NOT NULL,
    latency_s          DOUBLE NOT NULL,
    attempts           INTEGER NOT NULL,
    cached             BOOLEAN NOT NULL,
    error              VARCHAR,            -- NULL when the call succeeded
    created_at         TIMESTAMP NOT NULL
);

CREATE TABLE IF NOT EXISTS env_cache (
    cache_key          VARCHAR PRIMARY KEY,  -- sha256 of (model, messages, sampling params)
    model              VARCHAR NOT NULL,
    reply              VARCHAR NOT NULL,
    prompt_tokens      INTEGER NOT NULL,
    completion_tokens  INTEGER NOT NULL,
    created_at         TIMESTAMP NOT NULL
);

CREATE TABLE IF NOT EXISTS eval_predictions (
    run_id        VARCHAR NOT NULL,
    env_name      VARCHAR NOT NULL,
    method        VARCHAR NOT NULL,     -- direct / cot / agent:<ckpt> / agent_only:<ckpt>
    dataset       VARCHAR NOT NULL,
    question_id   VARCHAR NOT NULL,
    prediction    VARCHAR NOT NULL,     -- '' when `error` is set
    primary_metric VARCHAR NOT NULL,
    score         DOUBLE,               -- the primary metric; the metrics are NULL when `error` is set
    em            DOUBLE,
    f1            DOUBLE,
    substring     DOUBLE,
    ssim          DOUBLE,
    num_turns     INTEGER NOT NULL,
    env_prompt_tokens      INTEGER NOT NULL,
    env_completion_tokens  INTEGER NOT NULL,
    created_at    TIMESTAMP NOT NULL,
    error         VARCHAR,              -- the environment call failed: a failure, not a prediction
    PRIMARY KEY (run_id, env_name, method, dataset, question_id)
);

CREATE TABLE IF NOT EXISTS eval_results (
    run_id        VARCHAR NOT NULL,
    env_name      VARCHAR NOT NULL,
    method        VARCHAR NOT NULL,
    dataset       VARCHAR NOT NULL,
    n             INTEGER NOT NULL,     -- questions, failed ones included
    primary_metric VARCHAR NOT NULL,
    score         DOUBLE,               -- means over the n - errors scored rows (NULL when none)
    em            DOUBLE,
    f1            DOUBLE,
    substring     DOUBLE,
    ssim          DOUBLE,
    env_prompt_tokens      BIGINT NOT NULL,
    env_completion_tokens  BIGINT NOT NULL,
    cost_usd      DOUBLE NOT NULL,
    created_at    TIMESTAMP NOT NULL,
    errors        INTEGER NOT NULL DEFAULT 0,  -- rows whose environment call failed
    ci_low        DOUBLE,               -- 95% bootstrap interval of `score` over the scored rows
    ci_high       DOUBLE,
    PRIMARY KEY (run_id, env_name, method, dataset)
);

CREATE TABLE IF NOT EXISTS baseline_instructions (
    cache_key     VARCHAR PRIMARY KEY,  -- sha256 of method, endpoints, budget settings, training questions
    method        VARCHAR NOT NULL,     -- opro / gepa / textgrad
    env_name      VARCHAR NOT NULL,
    instruction   VARCHAR NOT NULL,     -- the optimised instruction the evaluation uses
    train_score   DOUBLE,               -- its mean primary score on the training questions (NULL: none scored)
    spend         VARCHAR NOT NULL,     -- JSON: env_calls, prompt/completion tokens, cost_usd
    history       VARCHAR NOT NULL,     -- JSON: every candidate with its training score
    created_at    TIMESTAMP NOT NULL
);

CREATE TABLE IF NOT EXISTS question_renames (
    old_id        VARCHAR PRIMARY KEY,  -- a question's id under an earlier row-key rule
    new_id        VARCHAR NOT NULL,     -- its id now; trajectories, env calls and predictions follow it
    source_file   VARCHAR NOT NULL,
    renamed_at    TIMESTAMP NOT NULL
);

-- Warehouses made before environment failures were recorded as such: add the error columns and
-- let failed rows hold NULL scores (each statement is a no-op on a current file).
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS error VARCHAR;
ALTER TABLE eval_predictions ADD COLUMN IF NOT EXISTS error VARCHAR;
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS errors INTEGER DEFAULT 0;
ALTER TABLE trajectories ALTER COLUMN reward_format DROP NOT NULL;
ALTER TABLE trajectories ALTER COLUMN reward_answer DROP NOT NULL;
ALTER TABLE trajectories ALTER COLUMN reward_total DROP NOT NULL;
ALTER TABLE eval_predictions ALTER COLUMN score DROP NOT NULL;
ALTER TABLE eval_predictions ALTER COLUMN em DROP NOT NULL;
ALTER TABLE eval_predictions ALTER COLUMN f1 DROP NOT NULL;
ALTER TABLE eval_predictions ALTER COLUMN substring DROP NOT NULL;
ALTER TABLE eval_predictions ALTER COLUMN ssim DROP NOT NULL;
ALTER TABLE eval_results ALTER COLUMN score DROP NOT NULL;
ALTER TABLE eval_results ALTER COLUMN em DROP NOT NULL;
ALTER TABLE eval_results ALTER COLUMN f1 DROP NOT NULL;
ALTER TABLE eval_results ALTER COLUMN substring DROP NOT NULL;
ALTER TABLE eval_results ALTER COLUMN ssim DROP NOT NULL;
-- Warehouses made before results carried intervals.
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS ci_low DOUBLE;
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS ci_high DOUBLE;

-- Warehouses made before weight syncs were versioned: trajectories of those runs keep NULL.
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS policy_version INTEGER;

-- The reward's cost part (`reward.cost`; 0 when off). NULL when `error` is set, and in rows written
-- before the column existed (every file, new or old, gets it here).
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS reward_cost DOUBLE;
-- Warehouses made before training pools: trajectories of those runs keep NULL (their one
-- environment is the run's `environment`, and each env_calls row names it).
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS env_name VARCHAR;

-- A dataset's own scoring (docs/tasks.md): the row's metadata columns as a JSON object, and the
-- import path of the dataset's answer scorer (NULL: the built-in `primary_metric`). Questions
-- ingested before keep NULL in both, which is what they meant.
ALTER TABLE questions ADD COLUMN IF NOT EXISTS metadata VARCHAR;
ALTER TABLE questions ADD COLUMN IF NOT EXISTS scorer VARCHAR;
-- The named parts of a dataset scorer's result beside its primary `score` (JSON; NULL: none).
ALTER TABLE eval_predictions ADD COLUMN IF NOT EXISTS parts VARCHAR;
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS parts VARCHAR;
