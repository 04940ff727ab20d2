// sat serve: the HTTP server (tools/cli/server.hpp) over one loaded model.
#include <memory>

#include "tools/cli/commands.hpp"
#include "tools/cli/server.hpp"
#include "vision/image.hpp"
#include "vision/pretrained.hpp"

namespace sat {

void add_serve_command(CLI::App& app) {
  struct ServeArgs {
    std::string model = default_model_path(), weights_dir;
    ServerOptions server;
    int threads = 0;
  };
  auto a = std::make_shared<ServeArgs>();
  auto* serve_cmd = app.add_subcommand(
      "serve",
      "Caption over HTTP: GET / (a page to try it in a browser), POST /caption (image bytes or a multipart file; "
      "?beam=&length_norm=&no_repeat=&consensus_weight=&memory_candidates=&object_evidence=&evidence_threshold=&neighbour_evidence=&beam_evidence=&relevance_weight=&beam_groups=&diversity=&candidates=N&"
      "include=&attention=1&objects=1), "
      "GET /health, GET /metrics (Prometheus). Requests that arrive together are captioned as one batch; "
      "SIGTERM finishes the accepted requests and exits");
  add_model_option(serve_cmd, a->model);
  serve_cmd->add_option("--weights-dir", a->weights_dir, "Folder holding encoder weights the model names");
  serve_cmd->add_option("--host", a->server.host, "Address to listen on (loopback unless told otherwise)")
      ->capture_default_str();
  serve_cmd->add_option("--port", a->server.port, "Port (0: any free one, printed)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  serve_cmd
      ->add_option("--max-batch", a->server.max_batch,
                   "Images captioned by one network call at most (1: one at a time)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  serve_cmd
      ->add_option("--batch-wait-ms", a->server.batch_wait_ms, "After a batch's first image, wait this long for more")
      ->capture_default_str()
      ->check(CLI::Range(0, 10000));
  serve_cmd->add_option("--queue", a->server.queue, "Captions in the server at once (arriving, waiting, captioned); beyond, 503 at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  serve_cmd
      ->add_option("--max-wait", a->server.max_wait_s,
                   "Seconds a caption may expect to wait, at the network's recent pace; beyond, 503 at once")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  serve_cmd->add_option("--max-bytes", a->server.max_bytes, "Largest request body (413 beyond)")
      ->capture_default_str()
      ->check(CLI::Range((size_t)1, (size_t)1 << 31));
  serve_cmd
      ->add_option("--http-threads", a->server.http_threads,
                   "Threads that decode images (one event loop serves every connection)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  serve_cmd->add_option("--max-connections", a->server.max_connections, "Connections open at once; beyond, 503")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  serve_cmd
      ->add_option("--request-timeout", a->server.request_timeout_s,
                   "Seconds from a request's first byte to its last, whatever the rate; 408 beyond")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  serve_cmd
      ->add_option("--pixel-budget", a->server.pixel_budget,
                   "Decoded pixels all requests may hold at once (a larger photo: 400; a full budget: 503)")
      ->capture_default_str()
      ->check(CLI::Range((uint64_t)1, (uint64_t)kMaxImagePixels));
  serve_cmd->add_option("--threads", a->threads, "Threads of the network (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  serve_cmd->callback([a] {
    install_stop_handler();  // a SIGTERM while the model loads still ends in a clean stop
    LoadOptions load;
    load.weights_dir = a->server.weights_dir = a->weights_dir;
    load.threads = a->threads;
    const Captioner captioner(a->model, load);
    serve(captioner, a->model, a->server);
  });
}

}  // namespace sat
