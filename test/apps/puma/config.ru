# frozen_string_literal: true

# A Rack app under Puma for test_puma.rb: each request burns a little CPU and
# answers with its process's pid. With MASTER_PROFILE set, the master
# profiles its own work before the workers fork (preload_app!). With
# PER_REQUEST set, the middleware answers permitted ?strobe=1 requests with
# their own profiles, and /posts reports what a Rails app would through
# ActiveSupport notifications (a query, the action). With CONTINUOUS_URL
# set, it is profiled continuously, to that Pyroscope stand-in.
require "strobe/middleware"

module PumaApp
  module_function

  def spin(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  end

  def master_work = spin(0.2)
  def worker_work = spin(0.01)

  def posts
    notifications = ActiveSupport::Notifications
    payload = { controller: "PostsController", action: "index", method: "GET", path: "/posts", status: 200 }
    notifications.instrument("process_action.action_controller", payload) do
      notifications.instrument("sql.active_record", name: "Post Load", sql: "SELECT * FROM posts WHERE id = 42") do
        spin(0.005)
      end
      worker_work
    end
  end
end

if ENV["MASTER_PROFILE"]
  Strobe.start(mode: :wall, raw: true)
  PumaApp.master_work
end

if ENV["CONTINUOUS_URL"]
  # Continuous profiling from boot: with preload_app! the master starts it
  # and each worker starts its own as it forks.
  require "strobe/continuous"
  Strobe::Continuous.start(url: ENV["CONTINUOUS_URL"], service_name: "puma-app", upload_every: 1,
                           overhead_target: false)
  use Strobe::Continuous::Endpoints
  run ->(_env) { PumaApp.spin(0.05); [200, { "content-type" => "text/plain" }, [Process.pid.to_s]] }
elsif ENV["PER_REQUEST"]
  require "active_support"
  require "active_support/notifications"
  # (The app routes /posts itself: it names that endpoint.)
  use Strobe::Middleware, permit: ->(env) { env["REMOTE_ADDR"] == "127.0.0.1" }, notifications: %i[sql controller],
                          endpoint: ->(env) { "GET /posts" if env["PATH_INFO"] == "/posts" }
  run lambda { |env|
    env["PATH_INFO"] == "/posts" ? PumaApp.posts : PumaApp.worker_work
    [200, { "content-type" => "text/plain" }, [Process.pid.to_s]]
  }
else
  use Strobe::Middleware, enabled: true, mode: :wall, path: "#{ENV.fetch('STROBE_OUT')}/", save_every: false,
                          save_interval: false
  run ->(_env) { PumaApp.worker_work; [200, { "content-type" => "text/plain" }, [Process.pid.to_s]] }
end
