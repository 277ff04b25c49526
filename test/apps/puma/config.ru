# frozen_string_literal: true

# A Rack app under Puma for test_puma.rb: each request burns a little CPU and
# answers with its process's pid. With MASTER_PROFILE set, the master
# profiles its own work before the workers fork (preload_app!).
require "strobe/middleware"

module PumaApp
  module_function

  def spin(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  end

  def master_work = spin(0.2)
  def worker_work = spin(0.01)
end

if ENV["MASTER_PROFILE"]
  Strobe.start(mode: :wall, raw: true)
  PumaApp.master_work
end

use Strobe::Middleware, enabled: true, mode: :wall, path: "#{ENV.fetch('STROBE_OUT')}/", save_every: false,
                        save_interval: false
run ->(_env) { PumaApp.worker_work; [200, { "content-type" => "text/plain" }, [Process.pid.to_s]] }
