# frozen_string_literal: true

# A minimal Rails application for test_rails.rb, under Puma: one model in a
# SQLite database, one controller. Its root is RAILS_APP_ROOT (a temporary
# directory the test fills), so that Rails loads the initializers the test
# writes there, as an application's config/initializers/*.rb, and keeps its
# database and tmp/ there.
require "logger"
require "rails"
require "active_record/railtie"
require "action_controller/railtie"

ENV["DATABASE_URL"] = "sqlite3:#{File.join(ENV.fetch('RAILS_APP_ROOT'), 'posts.sqlite3')}"

module StrobeRailsTest
  class Application < Rails::Application
    config.root = ENV.fetch("RAILS_APP_ROOT")
    config.load_defaults 8.1
    config.eager_load = false
    config.logger = Logger.new(nil)
    config.secret_key_base = "strobe-test-" * 8
    config.hosts.clear
    config.active_record.maintain_test_schema = false
  end
end

class Post < ActiveRecord::Base; end

class PostsController < ActionController::Base
  # Titles of the posts whose title matches, and a little work per post.
  def index
    titles = Post.where("title LIKE ?", "post%").order(:id).pluck(:title)
    render plain: "#{Process.pid} #{titles.map { |t| PostsController.digest(t) }.join(',')}"
  end

  def self.digest(title)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.0005
    title.sum while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    title.sum
  end
end

StrobeRailsTest::Application.initialize!
StrobeRailsTest::Application.routes.draw { get "/posts" => "posts#index" }

ActiveRecord::Schema.verbose = false
ActiveRecord::Schema.define do
  create_table :posts, if_not_exists: true do |t|
    t.string :title
  end
end
Post.insert_all(Array.new(20) { |i| { title: "post #{i}" } }) if Post.none?

run StrobeRailsTest::Application
