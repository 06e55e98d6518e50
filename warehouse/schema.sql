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
    reward_format   DOUBLE NOT NULL,
    reward_answer   DOUBLE NOT NULL,
    reward_total    DOUBLE NOT NULL,
    num_turns       INTEGER NOT NULL,
    stop_reason     VARCHAR NOT NULL,
    created_at      TIMESTAMP NOT NULL,
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
    prediction    VARCHAR NOT NULL,
    primary_metric VARCHAR NOT NULL,
    score         DOUBLE NOT NULL,      -- the primary metric
    em            DOUBLE NOT NULL,
    f1            DOUBLE NOT NULL,
    substring     DOUBLE NOT NULL,
    ssim          DOUBLE NOT NULL,
    num_turns     INTEGER NOT NULL,
    env_prompt_tokens      INTEGER NOT NULL,
    env_completion_tokens  INTEGER NOT NULL,
    created_at    TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, env_name, method, dataset, question_id)
);

CREATE TABLE IF NOT EXISTS eval_results (
    run_id        VARCHAR NOT NULL,
    env_name      VARCHAR NOT NULL,
    method        VARCHAR NOT NULL,
    dataset       VARCHAR NOT NULL,
    n             INTEGER NOT NULL,
    primary_metric VARCHAR NOT NULL,
    score         DOUBLE NOT NULL,
    em            DOUBLE NOT NULL,
    f1            DOUBLE NOT NULL,
    substring     DOUBLE NOT NULL,
    ssim          DOUBLE NOT NULL,
    env_prompt_tokens      BIGINT NOT NULL,
    env_completion_tokens  BIGINT NOT NULL,
    cost_usd      DOUBLE NOT NULL,
    created_at    TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, env_name, method, dataset)
);
