import sys, time
from radserve.evaluation.pipeline_runs import pipeline_predictor, organ_label_values
from radserve.evaluation.runner import evaluate
from radserve.models.registry import ModelRegistry, bundled_model_dir
from radserve.pipeline.spec import load_pipeline
pipe = load_pipeline("ct-chest-abdomen")
reg = ModelRegistry([bundled_model_dir()])
specs = [reg.get(s.model, s.version).spec for s in pipe.steps]
seeds = [int(x) for x in sys.argv[1].split(",")]
for step in pipe.steps:
    spec = reg.get(step.model, step.version).spec
    t = time.time()
    out = evaluate(pipeline_predictor(reg, pipe, vary=spec.name), seeds=seeds, organ_labels=organ_label_values(specs),
                   precisions=["fp32", "int8", "bf16"], small=False, step_labels={l.value: l.name for l in spec.labels})
    for p, s in out.items():
        print(spec.key, p, "dice", s.dice_mean, "recall", s.recall_by_size, "fp", s.fp_per_study, "agree", s.agreement_vs_fp32, flush=True)
    print("seconds", round(time.time() - t), flush=True)
