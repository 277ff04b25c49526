# frozen_string_literal: true

require_relative "test_helper"
require_relative "puma_server"
require "json"
require "tmpdir"

# Strobe::Middleware in a real Rails 8.1 application (railties, actionpack,
# activerecord on SQLite) under Puma, with HTTP requests on 127.0.0.1
# (issue 19). Rails comes from `rake deps`, which installs it for the
# newest Ruby only (CI time); the same checks with a plain Rack app run on
# every Ruby in test_puma.rb.
class TestRails < Minitest::Test
  include PumaServer

  APP = File.join(__dir__, "apps/rails/config.ru")
  RAILS_RUBY = "4.0"

  def setup
    installed = !Dir[File.join(APP_GEMS_HOME, "specifications", "railties-8.1.*.gemspec")].empty?
    return if installed
    flunk "Rails is missing from #{APP_GEMS_HOME}: `rake deps` installs it" if RUBY_VERSION >= RAILS_RUBY

    skip "Rails 8.1 is installed for Ruby #{RAILS_RUBY} only (rake deps); test_puma.rb checks a Rack app here"
  end

  # The README's Rails initializer, as it is written there.
  def readme_initializer
    File.read(File.join(StrobeTestHelpers::ROOT, "README.md"))[%r{```ruby\n# config/initializers/strobe\.rb\n(.*?)```}m, 1] or
      flunk "README has no Rails initializer snippet"
  end

  # An application root in a temporary directory holding initializer as
  # config/initializers/strobe.rb; yields the directory.
  def with_app_root(initializer)
    retrying_shutdown_hang("strobe-rails") do |dir|
      FileUtils.mkdir_p(File.join(dir, "config/initializers"))
      File.write(File.join(dir, "config/initializers/strobe.rb"), initializer)
      yield dir
    end
  end

  def start_rails(dir, *args, &block)
    with_puma(dir, APP, "-t", "2:2", *args, env: { "RAILS_APP_ROOT" => dir }, &block)
  end

  # The README's initializer as copied: every request profiled, saved at
  # exit under tmp/strobe/ of the application's directory, with the SQL,
  # controller and view notifications as markers; the profile holds the
  # threads that served requests and none of Puma's idle ones.
  def test_the_readme_initializer_profiles_requests
    with_app_root(readme_initializer) do |dir|
      start_rails(dir) do |port|
        5.times { assert_equal "200", get(port, "/posts").code }
      end
      files = Dir[File.join(dir, "tmp/strobe/strobe-wall-*.json")]
      assert_equal 1, files.size, Dir[File.join(dir, "**/*")].inspect
      result = Strobe.load(files.first)
      requests = result[:markers].select { |m| m[:type] == :request }
      assert_equal 5, requests.size
      assert(requests.all? { |m| m[:data][:endpoint] == "PostsController#index" && m[:data][:status] == 200 })
      sql = result[:markers].select { |m| m[:type] == :"sql.active_record" }
      assert_operator sql.size, :>=, 5
      assert(sql.any? { |m| m[:data][:sql].match?(/\ASELECT "posts"\."title" FROM "posts" WHERE \(title LIKE \?\)/) },
             sql.map { |m| m[:data][:sql] }.uniq.inspect)
      actions = result[:markers].select { |m| m[:type] == :"process_action.action_controller" }
      assert_equal ["PostsController#index"] * 5, actions.map { |m| m[:name] }
      names = frame_names(result)
      assert_includes names, "PostsController#index"
      assert_empty names & IDLE_FRAMES, "no frame of a thread waiting for work"
      assert(result[:threads].values.all? { |t| t[:name].to_s.start_with?("puma srv tp") }, result[:threads].inspect)
    end
  end

  # A request that asks (?strobe=1, permitted) gets its own profile: its
  # thread only, as a flamegraph, or as a Firefox Profiler file with the
  # notifications' markers, or as pprof labelled with its endpoint.
  def test_a_request_gets_its_own_profile
    initializer = <<~RUBY
      require "strobe/middleware"
      Rails.application.config.middleware.use Strobe::Middleware,
        permit: ->(env) { env["REMOTE_ADDR"] == "127.0.0.1" }, notifications: %i[sql controller]
    RUBY
    with_app_root(initializer) do |dir|
      start_rails(dir) do |port|
        get(port, "/posts") # (the first request loads the code)
        assert_own_profiles(port, dir, "/posts", frame: "PostsController#index", endpoint: "PostsController#index",
                                                 sql: 'FROM "posts"')
      end
    end
  end

  # Puma in cluster mode: each of two workers saves its own file.
  def test_cluster_workers_save_their_own_profiles
    with_app_root(readme_initializer) do |dir|
      served = nil
      start_rails(dir, "-w", "2") do |port|
        served = requests_per_worker(port, workers: 2, each: 2, path: "/posts")
      end
      files = Dir[File.join(dir, "tmp/strobe/strobe-wall-*.json")]
      pids = files.map { |f| Integer(File.basename(f)[/strobe-wall-(\d+)-/, 1]) }
      assert_equal served.keys.sort, pids.sort
      files.each do |file|
        pid = Integer(File.basename(file)[/strobe-wall-(\d+)-/, 1])
        requests = Strobe.load(file)[:markers].count { |m| m[:type] == :request }
        assert_equal served[pid], requests, file
      end
    end
  end
end
