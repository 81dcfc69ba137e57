"""Interleaved A/B: latecast at main (cac9724, from git archive) and at this branch, beside DALI, on the photos,
each run a fresh process through peers.py's own child (warm-up 5 batches, one timed epoch)."""
import json, os, sys, time
sys.path.insert(0, "/work/wt/peers/benchmarks")
import peers
rounds = int(sys.argv[1]); out = sys.argv[2]
mnist = json.load(open("/work/peers/probe/mnist.spec"))
cj = json.load(open("/work/peers/probe/cjpeg.spec"))
st = json.load(open("/work/peers/work/cifar-all/jpeg/meta.json"))
cj["mean"], cj["std"] = st["mean"], st["std"]
mnist["data"]["beton"] = "/work/peers/work/mnist-all/mnist.beton"
cj["data"]["beton"] = "/work/peers/work/cifar-all/jpeg.beton"
ms = json.load(open("/work/peers/work/mnist-all/../mnist-all/labels.npy", "rb")) if False else None
photos = json.load(open("/work/peers/probe/photos.spec"))
photos["data"]["files"] = "/work/peers/work/photos-1000/files.json"
rows = []
for r in range(rounds):
    for spec in (photos,):
        for who, python, path in (("main", sys.executable, "/work/peers/base/src"),
                                  ("branch", sys.executable, "/work/wt/peers/src"),
                                  ("dali", "/work/peers/dali/bin/python", "")):
            os.environ["PYTHONPATH"] = path
            s = dict(spec, peer="dali" if who == "dali" else "latecast")
            res = peers.run_child(python, s)
            e = res["epochs"][0] if "epochs" in res else {}
            row = dict(round=r + 1, workload=s["workload"], who=who, load=os.getloadavg()[0], **e)
            rows.append(row)
            print(json.dumps(row), flush=True)
json.dump(rows, open(out, "w"))
